//! REFL (Abdelmoniem, Sahu, Canini & Fahmy, EuroSys'23, "REFL: Resource-Efficient
//! Federated Learning"): Intelligent Participant Selection (IPS), which gives each round's
//! slots first to the available clients that are predicted to be gone soon (the least
//! available), and Stale-Aware Aggregation (SAA), which folds the updates of stragglers
//! into later rounds with a staleness weight. Code: ahmedcs/REFL @ aa7e642,
//! `core/client_manager.py` (`resampleClients`, `getPriority`, `isAvailable`) and
//! `core/aggregator.py` (`round_completion_handler`), cited as `file:LINE`.
//!
//! **SAA is the engine's.** REFL's stale updates are `[system.stale]` (its knobs
//! `stale_update`, `stale_factor`, `stale_beta`, `scale_coff` under their names;
//! [`crate::system::StaleConfig`]), which works under any strategy; REFL's own runs set
//! `stale_update = -1` and `stale_factor = -4` (`run_exps.sh` lines 84-87). This module is
//! IPS.
//!
//! **The code's rule** (`client_manager.py:268-336` with `avail_priority = 1`, the value of
//! REFL's runs, `run_exps.sh` line 97, and the random sampler, which "does not matter"
//! once REFL is on, line 78):
//! 1. when at most K clients are online, all of them train (`:276-277`);
//! 2. each online client gets a priority over two slots of the round's time window (the
//!    moving-average deadline): 1 when it is available throughout the first slot but not
//!    throughout the second, 0 otherwise (`getPriority`, `:62-68`, `lookup_timeslots = 2`);
//!    a client about to leave is "least available";
//! 3. the priority-1 clients are taken first, uniformly at random when more than K
//!    (`:304`, `:325-327`), and the remaining slots are filled uniformly at random from the
//!    priority-0 clients (`:307-309`);
//! 4. a client that trained within the last `prohibit_reselect` rounds is not run again
//!    (`aggregator.py:696-703`).
//!
//! **What predicts availability.** REFL's code reads each client's *future* from the
//! behave trace (`isAvailable` checks the trace's periods ahead of the clock), an oracle
//! it blurs with `avail_probability` to stand for an on-device predictor's accuracy
//! (`argParser.py:50`; `run_exps.sh` line 99 says the accuracy "should match ... the
//! time-series model"). A server has no such oracle: fedsel predicts from what the server
//! observed, the availability of every client in every past round
//! ([`RoundContext::available`]), and nothing else. A slot is one round (REFL's window is
//! the moving average of the round's length, so its first slot is the round and its
//! second the next one). Every selectable client is available in the current round, so
//! the priority asks whether it will be gone in the next: the predicted probability that a
//! client available in one round is available in the next is its observed rate,
//! p̂_k = (s_k + 1) / (n_k + 2), where n_k counts the pairs of consecutive observed rounds
//! with k available in the first and s_k those with k available in both (a first-order
//! Markov estimate with Laplace's rule, so a client never seen twice in a row has 1/2).
//! Priority 1 is p̂_k < 1/2: predicted gone next round. The prediction costs no client
//! anything (the server keeps the counts), so nothing is booked. Under `policy = "fedbuff"`
//! the clients in flight are not offered to the selector, so a busy client counts as
//! unavailable in that round.
//!
//! **Departures from the code**, each deliberate:
//! - *the predictor*, above, in place of the trace oracle and `avail_probability`, which
//!   therefore is not a key;
//! - *K clients*. The code takes `min(K, len − 1)` of its shuffled list (`:326`), so a round
//!   whose priority clients number fewer than K (the list is then exactly K long) runs
//!   K − 1 clients, the one dropped drawn at random among priority and filling clients
//!   alike; here it runs K, the priority clients all included. `avail_priority = 2`
//!   (`:313-318`) differs from 1 only by that off-by-one (it keeps every priority client
//!   and drops one filler when too few remain), so the two are one rule here and the
//!   switch is the strategy itself (`avail_priority = 0`, REFL off, is `uniform`);
//! - *recently run clients* (`prohibit_reselect`) are left out before the priority rule
//!   rather than removed after it and replaced by uniformly drawn online clients
//!   (`aggregator.py:704-719`), which would let the replacements ignore the priority; when
//!   too few clients remain, the recently run ones fill the round, uniformly. The code also
//!   replaces clients whose late update is still pending (`:686-694`); a client whose
//!   update the round policy dropped was selected, so it is out for `prohibit_reselect`
//!   rounds like any other, which covers a pending update that the default
//!   `stale_update = -1` keeps waiting at most until it arrives, but not one that takes
//!   longer than that many rounds (the selector is not told when a late update is folded).
//!
//!
//! **What the departures do**, measured by `scripts/reference/refl_authors.py` (100
//! clients, K = 10, 100 rounds, 30 seeds, two-state Markov availability in three
//! federations of high, mixed and low persistence; the authors' code at
//! `avail_probability` 0.9, their runs' value). Given all three, fedsel's selection
//! frequencies lie 0.91-1.18 times the authors' own seed-to-seed distance from theirs. As
//! the code is, for each alone: the trace oracle sends 90-100 % of the picks to clients
//! that do leave next round where the predictor sends 48-69 % (7 % when almost nobody
//! leaves), 2.2-9.7 times the floor; `min(K, len − 1)` runs K − 1 clients in nearly every
//! round, 0.9-2.1 times; and the code's reselection step leaves 21-29 % of its picks to
//! clients run within the last 5 rounds even when others were online, 0.9-3.7 times,
//! because it removes entries from `clientsToRun` while iterating over it (the entry after
//! a removed one is skipped) and a replacement need only differ from the client it
//! replaces (`aggregator.py:704-719`). fedsel leaves recently run clients out whenever
//! enough others are online, which is what the step is for.
//!
//! The paper's text was not at hand when this was written (only its abstract): the rule
//! is the code's, and no `paper` protocol is offered.

use serde::{Deserialize, Serialize};

use super::{ClientQuery, RoundContext, Selection, Selector, Setup, weighted_without_replacement};
use crate::error::Error;
use crate::rng::Rng;

/// REFL's IPS options: the code's names and defaults. Every value is meaningful (0 turns
/// the one option off), so none is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReflConfig {
    /// REFL's `prohibit_reselect` (`argParser.py:57`, default 5): a client that trained in
    /// round t is not selected before round t + `prohibit_reselect`; 0 turns this off.
    pub prohibit_reselect: usize,
}

impl Default for ReflConfig {
    fn default() -> Self {
        Self {
            prohibit_reselect: 5,
        }
    }
}

impl ReflConfig {
    /// Whether every option has its default (the config then leaves the table out).
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// What the server has observed, all of it checkpointed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
struct State {
    /// The last round whose availability was observed, and who was available then.
    last_round: Option<usize>,
    last_available: Vec<bool>,
    /// n_k: consecutive observed rounds with client k available in the first.
    seen: Vec<u32>,
    /// s_k: those with k available in the second as well.
    stayed: Vec<u32>,
    /// The last round each client was selected in.
    last_run: Vec<Option<usize>>,
}

/// The REFL (IPS) selector.
#[derive(Debug, Clone)]
pub struct Refl {
    cfg: ReflConfig,
    state: State,
}

impl Refl {
    /// A selector with the given options.
    pub fn new(cfg: ReflConfig) -> Self {
        Self {
            cfg,
            state: State::default(),
        }
    }

    /// Records round `round`'s availability: each client available in the previous round,
    /// if it was observed, adds one pair, and one stay if it is available again now.
    fn observe_availability(&mut self, round: usize, available: &[usize]) {
        let s = &mut self.state;
        let mut now = vec![false; s.last_available.len()];
        for &k in available {
            now[k] = true;
        }
        if s.last_round.is_some_and(|r| r + 1 == round) {
            for (k, &here) in now.iter().enumerate() {
                if s.last_available[k] {
                    s.seen[k] += 1;
                    s.stayed[k] += u32::from(here);
                }
            }
        }
        s.last_round = Some(round);
        s.last_available = now;
    }

    /// p̂_k = (s_k + 1) / (n_k + 2): the predicted probability that client `k`, available
    /// now, is available in the next round.
    fn predicted(&self, k: usize) -> f64 {
        (f64::from(self.state.stayed[k]) + 1.0) / (f64::from(self.state.seen[k]) + 2.0)
    }

    /// Whether client `k` trained within the last `prohibit_reselect` rounds before `round`.
    fn recent(&self, k: usize, round: usize) -> bool {
        self.state.last_run[k].is_some_and(|r| round - r < self.cfg.prohibit_reselect)
    }
}

/// REFL's priority rule over `candidates` (ascending ids) with predictions `p` (one per
/// candidate), `budget` slots: the clients predicted gone next round (p̂ < 1/2) first,
/// uniformly when more than the budget, then uniform draws among the others.
fn prioritised(candidates: &[usize], p: &[f64], budget: usize, rng: &mut Rng) -> Vec<usize> {
    let side = |leaves: bool| -> Vec<usize> {
        candidates
            .iter()
            .zip(p)
            .filter(|&(_, &p)| (p < 0.5) == leaves)
            .map(|(&k, _)| k)
            .collect()
    };
    let (leaving, staying) = (side(true), side(false));
    let uniform = |ids: &[usize], k: usize, rng: &mut Rng| {
        weighted_without_replacement(ids, &vec![1.0; ids.len()], k, rng)
    };
    let mut out = uniform(&leaving, budget, rng);
    let rest = budget - out.len();
    out.extend(uniform(&staying, rest, rng));
    out
}

impl Selector for Refl {
    fn name(&self) -> &'static str {
        "refl"
    }

    fn setup(&mut self, setup: &Setup) {
        let n = setup.sizes.len();
        self.state = State {
            last_round: None,
            last_available: vec![false; n],
            seen: vec![0; n],
            stayed: vec![0; n],
            last_run: vec![None; n],
        };
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        _query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        self.observe_availability(ctx.round, ctx.available);
        let budget = ctx.budget.min(ctx.available.len());
        let clients = if ctx.available.len() <= budget {
            ctx.available.to_vec()
        } else {
            let (recent, fresh): (Vec<usize>, Vec<usize>) = ctx
                .available
                .iter()
                .partition(|&&k| self.recent(k, ctx.round));
            let p: Vec<f64> = fresh.iter().map(|&k| self.predicted(k)).collect();
            let mut picked = prioritised(&fresh, &p, budget, rng);
            let short = budget - picked.len();
            picked.extend(weighted_without_replacement(
                &recent,
                &vec![1.0; recent.len()],
                short,
                rng,
            ));
            picked
        };
        for &k in &clients {
            self.state.last_run[k] = Some(ctx.round);
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
        let loaded: State = super::load_state("refl", state)?;
        let n = self.state.seen.len();
        super::check_loaded("refl", "availability flags", loaded.last_available.len(), n)?;
        super::check_loaded("refl", "pair counts", loaded.seen.len(), n)?;
        super::check_loaded("refl", "stay counts", loaded.stayed.len(), n)?;
        super::check_loaded("refl", "selection rounds", loaded.last_run.len(), n)?;
        self.state = loaded;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::testing::{FixedLosses, setup};

    fn refl(prohibit_reselect: usize) -> Refl {
        let mut s = Refl::new(ReflConfig { prohibit_reselect });
        s.setup(&setup(&[0.25; 4]));
        s
    }

    /// Four clients over rounds 0-3: client 0 always available, 1 in rounds 0 and 2, 2 in
    /// rounds 0, 1 and 3, 3 in round 3 only. Pairs (n, s) by hand: 0 has three pairs, all
    /// stays: p̂ = 4/5; 1 has (0→1) and (2→3), both leaves: 1/4; 2 has (0→1) stay and
    /// (1→2) leave: 2/4; 3 has none: 1/2.
    fn history(s: &mut Refl) {
        for (t, avail) in [&[0, 1, 2][..], &[0, 2], &[0, 1], &[0, 2, 3]]
            .into_iter()
            .enumerate()
        {
            s.observe_availability(t, avail);
        }
    }

    #[test]
    fn availability_is_predicted_from_observed_rounds_by_hand() {
        let mut s = refl(0);
        history(&mut s);
        assert_eq!(s.state.seen, [3, 2, 2, 0]);
        assert_eq!(s.state.stayed, [3, 0, 1, 0]);
        let p: Vec<f64> = (0..4).map(|k| s.predicted(k)).collect();
        assert_eq!(p, [0.8, 0.25, 0.5, 0.5]);
        // A gap in the observed rounds (a resume, a skipped round) adds no pair: round 6
        // follows round 3 but not directly.
        s.observe_availability(6, &[0, 1, 2, 3]);
        assert_eq!(s.state.seen, [3, 2, 2, 0]);
        // Round 7 follows 6: every client adds a pair, 0 and 3 stay, 1 and 2 leave.
        s.observe_availability(7, &[0, 3]);
        assert_eq!(s.state.seen, [4, 3, 3, 1]);
        assert_eq!(s.state.stayed, [4, 0, 1, 1]);
        assert_eq!(s.predicted(3), 2.0 / 3.0);
    }

    #[test]
    fn the_least_available_go_first_and_the_rest_are_uniform() {
        // Round 4 offers all four after the history above (the pairs 3→4 then add: 0 stays,
        // 2 and 3 stay, 1 was away in round 3): p̂ = (5/6, 1/4, 3/5, 2/3). Only client 1 is
        // predicted gone (p̂ < 1/2), so with K = 2 it is in every round and the other slot is
        // uniform over 0, 2, 3; with K = 1 it is the only choice.
        let mut counts = [0usize; 4];
        let mut rng = stream(1, Purpose::Selection, 4, 0);
        let trials = 3000;
        for _ in 0..trials {
            let mut s = refl(0);
            history(&mut s);
            let ctx = RoundContext {
                round: 4,
                available: &[0, 1, 2, 3],
                budget: 2,
                clock_s: None,
            };
            let picked = s.select(&ctx, &mut FixedLosses(vec![]), &mut rng).unwrap();
            assert_eq!(picked.clients.len(), 2);
            assert_eq!(picked.clients[0], 1, "the priority client comes first");
            for k in picked.clients {
                counts[k] += 1;
            }
        }
        assert_eq!(counts[1], trials);
        for k in [0, 2, 3] {
            let f = counts[k] as f64 / trials as f64;
            assert!((f - 1.0 / 3.0).abs() < 0.04, "client {k}: {f}");
        }
        let p: Vec<f64> = [0, 1, 2, 3]
            .iter()
            .map(|&k| {
                let mut s = refl(0);
                history(&mut s);
                s.observe_availability(4, &[0, 1, 2, 3]);
                s.predicted(k)
            })
            .collect();
        assert_eq!(p, [5.0 / 6.0, 0.25, 0.6, 2.0 / 3.0]);
        // Two predicted gone and K = 1: one of them, uniformly; never a staying client.
        let mut first = [0usize; 4];
        for _ in 0..2000 {
            let picked = prioritised(&[0, 1, 2, 3], &[0.8, 0.25, 0.4, 0.5], 1, &mut rng);
            first[picked[0]] += 1;
        }
        assert_eq!((first[0], first[3]), (0, 0));
        assert!(first[1] > 900 && first[2] > 900, "{first:?}");
        // At most K online: all of them.
        let mut s = refl(0);
        let ctx = RoundContext {
            round: 0,
            available: &[1, 3],
            budget: 2,
            clock_s: None,
        };
        let picked = s.select(&ctx, &mut FixedLosses(vec![]), &mut rng).unwrap();
        assert_eq!(picked.clients, [1, 3]);
    }

    #[test]
    fn a_recently_run_client_waits_prohibit_reselect_rounds() {
        // prohibit_reselect = 2: a client selected in round t is out in round t + 1 and
        // back in round t + 2. With 4 clients always available and K = 2, round 1 must
        // take the two that round 0 left out; when too few are fresh, the recent fill in.
        let mut s = refl(2);
        let mut rng = stream(2, Purpose::Selection, 0, 0);
        let all = [0, 1, 2, 3];
        let ctx = |t| RoundContext {
            round: t,
            available: &all,
            budget: 2,
            clock_s: None,
        };
        let first = s
            .select(&ctx(0), &mut FixedLosses(vec![]), &mut rng)
            .unwrap();
        let mut second = s
            .select(&ctx(1), &mut FixedLosses(vec![]), &mut rng)
            .unwrap()
            .clients;
        second.sort_unstable();
        let mut rest: Vec<usize> = all
            .iter()
            .copied()
            .filter(|k| !first.clients.contains(k))
            .collect();
        rest.sort_unstable();
        assert_eq!(second, rest);
        let ctx3 = RoundContext {
            round: 2,
            available: &all,
            budget: 3,
            clock_s: None,
        };
        let third = s.select(&ctx3, &mut FixedLosses(vec![]), &mut rng).unwrap();
        assert_eq!(third.clients.len(), 3);
        for k in &first.clients {
            assert!(third.clients.contains(k), "round 0's clients are back");
        }
    }

    #[test]
    fn a_run_saved_midway_continues_identically_and_a_foreign_state_is_refused() {
        let avail: Vec<Vec<usize>> = (0..20)
            .map(|t| (0..12).filter(|k| (k + t) % 3 != 0).collect())
            .collect();
        let play = |s: &mut Refl, rounds: std::ops::Range<usize>| -> Vec<Vec<usize>> {
            rounds
                .map(|t| {
                    let mut rng = stream(3, Purpose::Selection, t as u64, 0);
                    let ctx = RoundContext {
                        round: t,
                        available: &avail[t],
                        budget: 3,
                        clock_s: None,
                    };
                    s.select(&ctx, &mut FixedLosses(vec![]), &mut rng)
                        .unwrap()
                        .clients
                })
                .collect()
        };
        let make = |n: usize| {
            let mut s = Refl::new(ReflConfig::default());
            s.setup(&setup(&vec![1.0 / n as f64; n]));
            s
        };
        let mut whole = make(12);
        let all = play(&mut whole, 0..20);
        let mut first = make(12);
        let head = play(&mut first, 0..8);
        let mut resumed = make(12);
        resumed.load(&first.save()).unwrap();
        assert_eq!([head, play(&mut resumed, 8..20)].concat(), all);
        let err = make(5).load(&first.save()).unwrap_err().to_string();
        assert!(
            err.contains("12 availability flags where 5 belong"),
            "{err}"
        );
    }

    #[test]
    fn a_set_table_survives_the_resolved_config_and_a_bad_value_is_named() {
        use crate::config::Config;
        let load = |text: &str| Config::from_toml_str(text, "test", &[]);
        let set =
            load("[selection]\nstrategy = \"refl\"\n[selection.refl]\nprohibit_reselect = 2\n")
                .unwrap();
        assert_eq!(set.selection.refl.prohibit_reselect, 2);
        let resolved = set.to_resolved_toml();
        assert_eq!(load(&resolved).unwrap().selection.refl, set.selection.refl);
        let default = load("[selection]\nstrategy = \"refl\"\n").unwrap();
        assert!(!default.to_resolved_toml().contains("[selection.refl]"));
        let e = load("[selection.refl]\nprohibit_reselect = -1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("prohibit_reselect"), "{e}");
    }
}

//! FedBalancer (Shin, Li, Liu & Lee, MobiSys'22, "FedBalancer: Data and Pace Control for
//! Efficient Federated Learning on Heterogeneous Clients"): each selected client trains only
//! on its samples whose loss is above a loss threshold (Alg. 1), the server moves the
//! threshold (Alg. 2) and the round's deadline (Alg. 4) by a ratio control on the loss
//! progress per second (Alg. 3), and clients are selected Oort-style with a statistical
//! utility over the samples above the threshold. Code: jaemin-shin/FedBalancer @ 1d187c8,
//! `models/fedbalancer.py`, `models/server.py`, `models/client.py`, `models/main.py`, cited
//! as `file:LINE`; the algorithm numbers are the code's own comments. The paper's text was
//! not at hand when this was written (only its abstract), so the rule is the code's and no
//! `paper` protocol is offered.
//!
//! **On the client** (a [`SampleRule`], run by the engine before the client trains):
//! 1. the client passes every training example forward through the model it received and
//!    sorts the losses ascending (`fedbalancer.py:59-74`, `client.py:170-171`);
//! 2. i is the first position whose loss is at least the threshold, or the last position
//!    when none is (Python's loop variable after a loop that never breaks,
//!    `fedbalancer.py:77-79`); the samples at i and after are "over the threshold";
//! 3. *Alg. 1* (`fedbalancer.py:86-132`), T being the round's deadline and t_b the client's
//!    seconds per training batch, for a client that was selected before (the code's
//!    `train_time_per_batch_list` is empty at a first selection):
//!    - if its whole data trains within T, it keeps every sample;
//!    - else if the samples over the threshold train within T (epochs only: under
//!      `train.work.steps` a round's time does not depend on the samples kept, so this case
//!      is the first one), it keeps ⌊T / (E·t_b)·B⌋ samples (capped at all), the share
//!      1 − `fb_p` drawn from those under the threshold and the rest from those over it,
//!      each part capped by its pool;
//!    - else it keeps as many samples as are over the threshold, the share 1 − `fb_p` of
//!      them drawn from under the threshold (capped by that pool) and the rest from over it;
//! 4. it trains on the kept samples only, and reports, with its update, the smallest loss
//!    and the 80th percentile of its losses (each plus N(0, `noise_factor`) noise,
//!    `server.py:269-272`), the sum of squares and the count of the losses strictly above
//!    the threshold (`server.py:258-266`), the sum and count of all its losses
//!    (`server.py:252-253`) and, where the run has a clock, its transfer time, its training
//!    time for one epoch and for the round's work on the kept samples, and its forward
//!    pass's time (what the code's server reads from its client objects for Alg. 4).
//!
//! **On the server**, each round:
//! - *selection*: fedsel's Oort ([`super::oort`], options under `[selection.oort]`), each
//!   reporting client's statistical utility replaced by the one FedBalancer's code gives
//!   it: √(Σ ℓ² / n)·n over its n losses above the threshold, 0 when there are none
//!   (`oort.py:93-106` with `fb_client_selection`), which is Oort's Eq. 1 over those
//!   samples;
//! - *Alg. 2* (`fedbalancer.py:263-271`), once any client has reported: threshold =
//!   L + (H − L)·`lt_ratio`, L the smallest reported minimum and H the mean reported 80th
//!   percentile, over **every report of the run**: the code's `current_round_loss_min` and
//!   `_max` lists are appended to and never cleared; it stays 0 while both it and the ratio
//!   are 0;
//! - *Alg. 4* (`fedbalancer.py:294-336`), once more than half the clients (or more than
//!   200) have reported: over the round's selected clients, each one's expected completion
//!   time at one epoch and at the round's work (both transfers, its forward pass, its
//!   training and the guard time), the deadlines d_low and d_high that maximise the
//!   clients completed per second (`findPeakDDLE`: the first integer second t ≥ 1 with the
//!   most clients done by t over t), and T = d_low + (d_high − d_low)·`ddl_ratio`. The
//!   round policy `deadline` closes the round at T ([`Selector::round_deadline_s`]) in
//!   place of `system.round.deadline_s`; the other policies close rounds as they do, and T
//!   only sizes the clients' sample selection. The first T is the mean of the clients'
//!   registered round trips ([`Setup::durations`]; `main.py:96-122`). Without a clock there
//!   is no deadline: T = ∞, so a client selected before keeps all its data;
//! - *Alg. 3* (`fedbalancer.py:274-291`, `server.py:410-419`), after a round with
//!   reports: the round's loss per second, (Σ ℓ / Σ n) / T, is recorded; every `fb_w`
//!   recorded rounds, when at least 2·`fb_w` are recorded, the mean of the window before
//!   less the mean of the last window is the reward: when positive, `lt_ratio` rises and
//!   `ddl_ratio` falls by their steps, otherwise the reverse, each kept in [0, 1] as the
//!   code keeps it (a step that would leave the interval is not taken);
//! - *guard time* (`server.py:433-446`, `:486-488`): 10 s more when more than a tenth of
//!   K clients were dropped in two rounds running, back to 0 otherwise, and 10 s more
//!   after a round in which no update was used.
//!
//! **What cannot be faithful here**, each said where it applies:
//! - *inference pipelining*. The code's shipped FedBalancer config sets
//!   `fb_inference_pipelining = True`: a client passes its whole data forward only when first
//!   selected, and afterwards refreshes the losses of the samples it trains from the forward
//!   passes of its first local epoch (`client.py:170-171`, the loss list of
//!   `model.py:run_epoch`), at no extra cost. fedsel's local training does not return
//!   per-sample losses (the fused gradient paths compute the batch's mean only) and the
//!   engine keeps no per-client loss list between rounds, so only the code's other mode,
//!   `fb_inference_pipelining = False` (its `config.py` default), is implemented: a full
//!   forward pass every round, booked as `sample_examples` and on the clock;
//! - *Oort*. FedBalancer's code carries its own Oort variant (`oort.py`): ε decays by 0.98
//!   while above 0.2 and drops to 0 once every client was explored, exploration takes the
//!   fastest unexplored clients, and the system penalty is (T / t)^8 against FedBalancer's
//!   deadline. fedsel calls its own Oort (FedScale's rules) with FedBalancer's utility, so
//!   these are Oort's (set `selection.oort.round_penalty = 8` for the code's exponent).
//!   The effect is large: against the authors' `oort.py` as it is (pacer off, exponent 8,
//!   their shipped run), fedsel's selection frequencies lie 0.11-0.15 in total variation
//!   from theirs, whose own seed-to-seed distance is 0.003 (their variant is close to a
//!   greedy top K; `oort.py:216` stamps `last_selected_round` through a stale loop
//!   variable, which likely switches the staleness bonus off; not isolated), so fedsel's
//!   FedBalancer selects as FedScale's Oort would with FedBalancer's utility, not as the
//!   FedBalancer code does;
//! - *the clients' expected times* in Alg. 4 are the mean of their last five reported
//!   training times, where the code computes one time from the mean of their last five
//!   sample counts (ceil(mean / B) batches), and a selected client that never reported is
//!   expected to take its registered round trip at both ends (the code reads its profiled
//!   device directly);
//! - the first deadline leaves out the forward pass the code adds to each client's mean
//!   round trip (`main.py:110-111`): the registered round trip does not include it; and it
//!   is the mean itself, where the code truncates it to whole seconds
//!   (`int(np.mean(...))`, `main.py:122`), under a second on a deadline of tens of seconds
//!   (25.855 s against 25 s in `scripts/reference/fedbalancer_authors.py`'s run), and
//!   only for the rounds before Alg. 4 first moves it.
//!
//! Beside the code (`scripts/reference/fedbalancer_authors.py`), Alg. 2's threshold and
//! Alg. 4's deadline agree with the authors' `fedbalancer.py` to 6.6e-16 (relative) on 200
//! injected server states and round by round over a 40-round run, both ratios exactly; the
//! selection frequencies lie 0.84-1.03 times FedScale's Oort's own seed-to-seed distance
//! from FedScale's Oort fed FedBalancer's utility. Alg. 1 (which samples a client keeps) is
//! not reachable from outside the engine and was not compared.

use rand::seq::index::sample;
use serde::{Deserialize, Serialize};

use super::oort::{Oort, OortConfig};
use super::{
    ClientPlan, ClientQuery, Feedback, RoundContext, SampleChoice, SampleRule, Selection, Selector,
    Setup,
};
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use crate::validate::{check, check_prob};

/// The guard time's step in seconds (`server.py:444`, `:488`).
const GUARD_STEP_S: f64 = 10.0;

/// The report's layout: its first six entries always, the last four with a clock.
const MIN: usize = 0;
const P80: usize = 1;
const OVER_SQ: usize = 2;
const OVER_N: usize = 3;
const SUM: usize = 4;
const COUNT: usize = 5;
const TRANSFER_S: usize = 6;
const LOW_S: usize = 7;
const HIGH_S: usize = 8;
const PASS_S: usize = 9;

/// FedBalancer's options: the code's names, with the values of its shipped FedBalancer
/// run (`configs/femnist/femnist_fedbalancer.cfg`); the class defaults of `config.py`
/// (`fb_w` 1, both steps 0) turn both controls off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FedBalancerConfig {
    /// `fb_p` as the config file reads it (1.0): the share of the kept samples drawn from
    /// those over the loss threshold; the rest come from under it (`config.py:155-156`
    /// stores 1 − `fb_p`).
    pub fb_p: f64,
    /// `fb_w` (20): the ratio control's window in rounds (Alg. 3).
    pub fb_w: usize,
    /// `fb_simple_control_lt_stepsize` (0.05): the loss threshold ratio's step.
    pub fb_simple_control_lt_stepsize: f64,
    /// `fb_simple_control_ddl_stepsize` (0.05): the deadline ratio's step; 0 keeps the
    /// first deadline (the code then skips Alg. 4, `server.py:139`).
    pub fb_simple_control_ddl_stepsize: f64,
    /// `noise_factor` (0.0): σ of the Gaussian noise on each reported loss statistic.
    pub noise_factor: f64,
    /// `fb_inference_pipelining` (false, `config.py:47`): only `false`, a whole forward
    /// pass every round, is implemented (see the module doc for what `true` needs).
    pub fb_inference_pipelining: bool,
}

impl Default for FedBalancerConfig {
    fn default() -> Self {
        Self {
            fb_p: 1.0,
            fb_w: 20,
            fb_simple_control_lt_stepsize: 0.05,
            fb_simple_control_ddl_stepsize: 0.05,
            noise_factor: 0.0,
            fb_inference_pipelining: false,
        }
    }
}

impl FedBalancerConfig {
    /// Whether every option has its default (the config then leaves the table out).
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks every option, naming the key it refuses.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check_prob(self.fb_p, "selection.fedbalancer.fb_p", false, false)?;
        check(
            self.fb_w > 0,
            "selection.fedbalancer.fb_w",
            "must be at least 1",
        )?;
        check_prob(
            self.fb_simple_control_lt_stepsize,
            "selection.fedbalancer.fb_simple_control_lt_stepsize",
            false,
            false,
        )?;
        check_prob(
            self.fb_simple_control_ddl_stepsize,
            "selection.fedbalancer.fb_simple_control_ddl_stepsize",
            false,
            false,
        )?;
        check(
            self.noise_factor.is_finite() && self.noise_factor >= 0.0,
            "selection.fedbalancer.noise_factor",
            format!("{} must be finite and ≥ 0", self.noise_factor),
        )?;
        check(
            !self.fb_inference_pipelining,
            "selection.fedbalancer.fb_inference_pipelining",
            "true needs each client's per-sample losses from its first local epoch and a loss \
             list kept between its rounds, which fedsel's training does not provide: only \
             false (a whole forward pass every round) is implemented",
        )
    }
}

/// A client's times as it last reported them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
struct Times {
    transfer_s: f64,
    pass_s: f64,
    /// Training seconds at one epoch and at the round's work, its last five rounds.
    low_s: Vec<f64>,
    high_s: Vec<f64>,
}

/// What the server has learned, all of it checkpointed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
struct State {
    loss_threshold: f64,
    lt_ratio: f64,
    ddl_ratio: f64,
    /// T; `None` without a clock (no deadline).
    deadline_s: Option<f64>,
    guard_s: f64,
    /// Every reported minimum and 80th percentile (Alg. 2).
    loss_mins: Vec<f64>,
    loss_p80s: Vec<f64>,
    /// Each round's loss per second (Alg. 3), and how many rounds had reports.
    round_losses: Vec<f64>,
    rounds: usize,
    /// Whether each client was selected before.
    selected_before: Vec<bool>,
    /// Each client's reported times.
    times: Vec<Option<Times>>,
    /// The clients the last round dropped, once a round has been observed.
    last_failed: Option<Vec<usize>>,
    /// The round's selection.
    selected: Vec<usize>,
}

/// The round's client-side rule: a snapshot of the server's threshold and deadline.
#[derive(Debug, Clone)]
struct Rule {
    threshold: f64,
    deadline_s: f64,
    fb_p: f64,
    noise_factor: f64,
    selected_before: Vec<bool>,
}

impl Rule {
    /// Alg. 1's choice among the samples, `order` being their positions by ascending loss
    /// and its first `under` those under the threshold (the code's i); ascending positions.
    fn keep(
        &self,
        order: &[usize],
        under: usize,
        client: usize,
        plan: &ClientPlan,
        rng: &mut Rng,
    ) -> Vec<usize> {
        let n = order.len();
        let batch = plan.batch_size.max(1);
        let over = n - under;
        let before = self.selected_before[client];
        let fits = |m: usize| {
            before
                && plan
                    .device
                    .is_none_or(|d| self.deadline_s > plan.steps(m) as f64 * d.batch_s)
        };
        let (easy, hard) = if fits(n) {
            return (0..n).collect();
        } else if let (true, Some(d), Some(e)) = (fits(over), plan.device, plan.epochs) {
            let cnt = ((self.deadline_s / (e as f64 * d.batch_s) * batch as f64) as usize).min(n);
            let easy = (cnt as f64 * (1.0 - self.fb_p)) as usize;
            if easy > under {
                (under, cnt - under)
            } else if cnt - easy > over {
                (cnt - over, over)
            } else {
                (easy, cnt - easy)
            }
        } else {
            let easy = ((over as f64 * (1.0 - self.fb_p)) as usize).min(under);
            (easy, over - easy)
        };
        let mut kept: Vec<usize> = sample(rng, under, easy)
            .into_iter()
            .map(|p| order[p])
            .chain(
                sample(rng, over, hard)
                    .into_iter()
                    .map(|p| order[under + p]),
            )
            .collect();
        kept.sort_unstable();
        kept
    }
}

/// numpy's `percentile(x, q)` of ascending `x` (linear between order statistics).
fn percentile(x: &[f64], q: f64) -> f64 {
    let pos = q / 100.0 * (x.len() - 1) as f64;
    let lo = pos.floor() as usize;
    match x.get(lo + 1) {
        Some(&hi) => x[lo] + (pos - lo as f64) * (hi - x[lo]),
        None => x[lo],
    }
}

impl SampleRule for Rule {
    fn choose(
        &self,
        client: usize,
        losses: &[f64],
        plan: &ClientPlan,
        rng: &mut Rng,
    ) -> SampleChoice {
        if losses.is_empty() {
            return SampleChoice::default();
        }
        let mut order: Vec<usize> = (0..losses.len()).collect();
        order.sort_by(|&a, &b| losses[a].total_cmp(&losses[b]));
        let under = order
            .iter()
            .position(|&p| losses[p] >= self.threshold)
            .unwrap_or(order.len() - 1);
        let keep = self.keep(&order, under, client, plan, rng);
        let sorted: Vec<f64> = order.iter().map(|&p| losses[p]).collect();
        let mut noise = || {
            if self.noise_factor > 0.0 {
                let normal = rand_distr::Normal::new(0.0, self.noise_factor)
                    .expect("a finite, non-negative σ");
                rand_distr::Distribution::sample(&normal, rng)
            } else {
                0.0
            }
        };
        let above = sorted.iter().filter(|&&l| l > self.threshold);
        let mut report = vec![
            sorted[0] + noise(),
            percentile(&sorted, 80.0) + noise(),
            above.clone().map(|l| l * l).sum(),
            above.count() as f64,
            sorted.iter().sum(),
            sorted.len() as f64,
        ];
        if let Some(d) = plan.device {
            let m = keep.len();
            let low = match plan.epochs {
                Some(_) => m.div_ceil(plan.batch_size.max(1)),
                None => plan.fixed_steps,
            };
            let high = plan.steps(m);
            report.extend([
                d.transfer_s,
                low as f64 * d.batch_s,
                high as f64 * d.batch_s,
                losses.len() as f64 * d.sample_inference_s,
            ]);
        }
        SampleChoice { keep, report }
    }
}

/// A client's statistical utility from its report: √(Σ ℓ² / n)·n over its n losses above
/// the threshold, 0 for none (`oort.py:96-100`).
fn utility(report: &[f64]) -> f64 {
    if report[OVER_N] > 0.0 {
        (report[OVER_SQ] / report[OVER_N]).sqrt() * report[OVER_N]
    } else {
        0.0
    }
}

/// `findPeakDDLE` (`fedbalancer.py:306-336`): the first integer second t ≥ 1 that
/// maximises the clients whose completion time is at most t, per second, scanning until
/// every client is done. The count only grows where t reaches a client's time rounded up,
/// and falls per second in between, so only those seconds (and t = 1) are candidates.
fn peak_deadline(times: &[f64]) -> f64 {
    let mut ceils: Vec<f64> = times.iter().map(|t| t.ceil().max(1.0)).collect();
    ceils.sort_by(f64::total_cmp);
    let (mut best_t, mut best) = (1.0, ceils.iter().filter(|&&c| c <= 1.0).count() as f64);
    for (i, &t) in ceils.iter().enumerate() {
        if ceils.get(i + 1) == Some(&t) {
            continue;
        }
        let per_s = (i + 1) as f64 / t;
        if per_s > best {
            (best_t, best) = (t, per_s);
        }
    }
    best_t
}

/// The FedBalancer selector.
#[derive(Debug, Clone)]
pub struct FedBalancer {
    cfg: FedBalancerConfig,
    oort: Oort,
    per_round: usize,
    registered: Option<Vec<f64>>,
    state: State,
    rule: Option<Rule>,
}

impl FedBalancer {
    /// A selector with FedBalancer's options and those of its Oort part.
    pub fn new(cfg: FedBalancerConfig, oort: OortConfig) -> Self {
        Self {
            cfg,
            oort: Oort::new(oort),
            per_round: 0,
            registered: None,
            state: State::default(),
            rule: None,
        }
    }

    /// Alg. 2: the loss threshold from every reported minimum and 80th percentile.
    fn update_threshold(&mut self) {
        let s = &mut self.state;
        if s.loss_mins.is_empty() || (s.loss_threshold == 0.0 && s.lt_ratio == 0.0) {
            return;
        }
        let low = s.loss_mins.iter().copied().fold(f64::INFINITY, f64::min);
        let high = s.loss_p80s.iter().sum::<f64>() / s.loss_p80s.len() as f64;
        s.loss_threshold = low + (high - low) * s.lt_ratio;
    }

    /// Client `k`'s expected completion time at one epoch (`low`) or at the round's work.
    fn expected_s(&self, k: usize, low: bool) -> f64 {
        let s = &self.state;
        let base = match &s.times[k] {
            Some(t) => {
                let train = if low { &t.low_s } else { &t.high_s };
                2.0 * t.transfer_s + t.pass_s + train.iter().sum::<f64>() / train.len() as f64
            }
            None => self.registered.as_ref().map_or(0.0, |r| r[k]),
        };
        base + s.guard_s
    }

    /// Alg. 4: T for the round's selected clients, once more than half the clients (or more
    /// than 200) have reported; unchanged before, without a clock, or with a zero step.
    fn update_deadline(&mut self, selected: &[usize]) {
        let explored = self.state.times.iter().filter(|t| t.is_some()).count();
        let n = self.state.times.len();
        let ready = ((n - explored) as f64) < n as f64 * 0.5 || explored > 200;
        if self.state.deadline_s.is_none()
            || self.cfg.fb_simple_control_ddl_stepsize == 0.0
            || self.state.loss_mins.is_empty()
            || !ready
            || selected.is_empty()
        {
            return;
        }
        let at =
            |low: bool| -> Vec<f64> { selected.iter().map(|&k| self.expected_s(k, low)).collect() };
        let (low, high) = (peak_deadline(&at(true)), peak_deadline(&at(false)));
        self.state.deadline_s = Some(low + (high - low) * self.state.ddl_ratio);
    }

    /// Alg. 3 after the `rounds`-th round with reports (0-based).
    fn ratio_control(&mut self, rounds: usize) {
        let w = self.cfg.fb_w;
        let s = &mut self.state;
        let h = &s.round_losses;
        if rounds % w != w - 1 || h.len() < 2 * w {
            return;
        }
        let mean = |x: &[f64]| x.iter().sum::<f64>() / x.len() as f64;
        let reward = mean(&h[h.len() - 2 * w..h.len() - w]) - mean(&h[h.len() - w..]);
        let (lt, ddl) = (
            self.cfg.fb_simple_control_lt_stepsize,
            self.cfg.fb_simple_control_ddl_stepsize,
        );
        if reward > 0.0 {
            if s.lt_ratio + lt <= 1.0 {
                s.lt_ratio += lt;
            }
            if s.ddl_ratio - ddl >= 0.0 {
                s.ddl_ratio -= ddl;
            }
        } else {
            if s.lt_ratio - lt >= 0.0 {
                s.lt_ratio -= lt;
            }
            if s.ddl_ratio + ddl <= 1.0 {
                s.ddl_ratio += ddl;
            }
        }
    }
}

impl Selector for FedBalancer {
    fn name(&self) -> &'static str {
        "fedbalancer"
    }

    fn setup(&mut self, setup: &Setup) {
        self.oort.setup(setup);
        let n = setup.sizes.len();
        self.per_round = setup.per_round;
        self.registered = setup.durations.clone();
        self.state = State {
            deadline_s: setup
                .durations
                .as_ref()
                .map(|d| d.iter().sum::<f64>() / d.len().max(1) as f64),
            ddl_ratio: 1.0,
            selected_before: vec![false; n],
            times: vec![None; n],
            ..State::default()
        };
        self.rule = None;
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        let selection = self.oort.select(ctx, query, rng)?;
        self.update_threshold();
        self.update_deadline(&selection.clients);
        let s = &mut self.state;
        self.rule = Some(Rule {
            threshold: s.loss_threshold,
            deadline_s: s.deadline_s.unwrap_or(f64::INFINITY),
            fb_p: self.cfg.fb_p,
            noise_factor: self.cfg.noise_factor,
            selected_before: s.selected_before.clone(),
        });
        for &k in &selection.clients {
            s.selected_before[k] = true;
        }
        s.selected.clone_from(&selection.clients);
        Ok(selection)
    }

    fn sample_rule(&self) -> Option<Box<dyn SampleRule>> {
        self.rule
            .clone()
            .map(|r| Box::new(r) as Box<dyn SampleRule>)
    }

    fn round_deadline_s(&self) -> Option<f64> {
        self.state.deadline_s
    }

    /// Oort learns from the round; the guard time moves with the clients dropped in two
    /// rounds running and with a round whose updates were all lost.
    fn observe(&mut self, f: &Feedback<'_>) {
        self.oort.observe(f);
        let s = &mut self.state;
        let failed: Vec<usize> = f.dropped.map_or(Vec::new(), |d| d.clients.to_vec());
        if let Some(last) = &s.last_failed {
            let again = failed.iter().filter(|k| last.contains(k)).count();
            if again as f64 > self.per_round as f64 * 0.1 {
                s.guard_s += GUARD_STEP_S;
            } else {
                s.guard_s = 0.0;
            }
        }
        s.last_failed = Some(failed);
        if f.selected.is_empty() && !s.selected.is_empty() {
            s.guard_s += GUARD_STEP_S;
        }
    }

    /// The clients' reports: Oort's utilities, Alg. 2's statistics, the times of Alg. 4,
    /// and Alg. 3 on the round's loss per second. A report with a non-finite entry is
    /// skipped, as the engine skips such an update.
    fn observe_samples(&mut self, _round: usize, clients: &[usize], reports: &[Vec<f64>]) {
        let (mut sum, mut count) = (0.0, 0.0);
        for (&k, r) in clients.iter().zip(reports) {
            if r.len() <= COUNT || r.iter().any(|x| !x.is_finite()) {
                continue;
            }
            self.oort.set_statistical_utility(k, utility(r));
            let s = &mut self.state;
            s.loss_mins.push(r[MIN]);
            s.loss_p80s.push(r[P80]);
            sum += r[SUM];
            count += r[COUNT];
            if r.len() > PASS_S {
                let t = s.times[k].get_or_insert_with(Times::default);
                t.transfer_s = r[TRANSFER_S];
                t.pass_s = r[PASS_S];
                for (v, x) in [(&mut t.low_s, r[LOW_S]), (&mut t.high_s, r[HIGH_S])] {
                    v.push(x);
                    if v.len() > 5 {
                        v.remove(0);
                    }
                }
            }
        }
        if count > 0.0 {
            let deadline = self.state.deadline_s.unwrap_or(f64::INFINITY);
            self.state.round_losses.push(sum / count / deadline);
            let rounds = self.state.rounds;
            self.ratio_control(rounds);
            self.state.rounds += 1;
        }
    }

    fn save(&self) -> serde_json::Value {
        serde_json::json!({ "oort": self.oort.save(), "fedbalancer": super::save_state(&self.state) })
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        self.oort.load(&state["oort"])?;
        let loaded: State = super::load_state("fedbalancer", &state["fedbalancer"])?;
        let n = self.state.times.len();
        super::check_loaded(
            "fedbalancer",
            "selection flags",
            loaded.selected_before.len(),
            n,
        )?;
        super::check_loaded("fedbalancer", "client times", loaded.times.len(), n)?;
        self.state = loaded;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::testing::setup;
    use crate::select::{DeviceTiming, Dropped};

    fn balancer(cfg: FedBalancerConfig, n: usize, durations: Option<Vec<f64>>) -> FedBalancer {
        let mut s = FedBalancer::new(cfg, OortConfig::default());
        s.setup(&Setup {
            per_round: 2,
            durations,
            ..setup(&vec![1.0 / n as f64; n])
        });
        s
    }

    /// A report of the loss statistics only: (min, p80, Σ over², n over, Σ, n).
    fn stats(min: f64, p80: f64, sum: f64, count: f64) -> Vec<f64> {
        vec![min, p80, 0.0, 0.0, sum, count]
    }

    fn rule(threshold: f64, deadline_s: f64, fb_p: f64, before: bool) -> Rule {
        Rule {
            threshold,
            deadline_s,
            fb_p,
            noise_factor: 0.0,
            selected_before: vec![before],
        }
    }

    /// Epochs(1) at batch 2, one second a batch.
    fn plan() -> ClientPlan {
        ClientPlan {
            epochs: Some(1),
            fixed_steps: 0,
            batch_size: 2,
            device: Some(DeviceTiming {
                batch_s: 1.0,
                sample_inference_s: 0.25,
                transfer_s: 0.5,
            }),
        }
    }

    /// Six samples; ascending they are positions 1, 5, 3, 0, 4, 2 (losses 0.1 ... 0.9), so
    /// a threshold of 0.4 puts 3 under it (i = 3) and {0, 2, 4} over it.
    const LOSSES: [f64; 6] = [0.5, 0.1, 0.9, 0.3, 0.7, 0.2];

    #[test]
    fn alg_1_keeps_the_samples_over_the_threshold_as_the_deadline_allows() {
        let mut rng = stream(1, Purpose::Probe, 0, 0);
        let keep = |r: &Rule, rng: &mut Rng| r.choose(0, &LOSSES, &plan(), rng).keep;
        // A first selection: as many as are over the threshold, all from over (fb_p = 1).
        assert_eq!(keep(&rule(0.4, 10.0, 1.0, false), &mut rng), [0, 2, 4]);
        // Selected before, 6 samples = 3 batches = 3 s fit a 10 s deadline: all of them.
        assert_eq!(
            keep(&rule(0.4, 10.0, 1.0, true), &mut rng),
            [0, 1, 2, 3, 4, 5]
        );
        // 2.5 s: all (3 s) do not fit, the 3 over the threshold (2 batches) do: ⌊2.5/1·2⌋ = 5
        // samples, fb_p = 1 wants 5 from over, which holds 3: 3 from over and 2 from under.
        for _ in 0..20 {
            let k = keep(&rule(0.4, 2.5, 1.0, true), &mut rng);
            assert_eq!(k.len(), 5);
            assert!([0, 2, 4].iter().all(|p| k.contains(p)), "{k:?}");
        }
        // 1.5 s: not even those fit: the count over the threshold, from over.
        assert_eq!(keep(&rule(0.4, 1.5, 1.0, true), &mut rng), [0, 2, 4]);
        // fb_p = 0.5 on a first selection: ⌊3·0.5⌋ = 1 from under, 2 from over.
        for _ in 0..20 {
            let k = keep(&rule(0.4, 10.0, 0.5, false), &mut rng);
            let under = k.iter().filter(|p| [1, 3, 5].contains(*p)).count();
            assert_eq!((k.len(), under), (3, 1), "{k:?}");
        }
        // Every loss under the threshold: the code's i stays at the last position, so the
        // highest-loss sample alone is "over" it (0.5 s: not even its one batch fits).
        assert_eq!(keep(&rule(5.0, 0.5, 1.0, true), &mut rng), [2]);
        // Without a clock there is no deadline: a client selected before keeps all.
        let no_clock = ClientPlan {
            device: None,
            ..plan()
        };
        let r = rule(0.4, f64::INFINITY, 1.0, true);
        assert_eq!(r.choose(0, &LOSSES, &no_clock, &mut rng).keep.len(), 6);
    }

    #[test]
    fn the_client_reports_its_loss_statistics_and_times() {
        let mut rng = stream(2, Purpose::Probe, 0, 0);
        let c = rule(0.4, 1.5, 1.0, true).choose(0, &LOSSES, &plan(), &mut rng);
        let sorted = [0.1, 0.2, 0.3, 0.5, 0.7, 0.9];
        // p80 of 6 sorted values sits at 0.8·5 = 4: 0.7. Over 0.4: 0.5, 0.7, 0.9.
        let over_sq = 0.5 * 0.5 + 0.7 * 0.7 + 0.9 * 0.9;
        let sum: f64 = sorted.iter().sum();
        // 3 kept samples: 2 batches at one epoch and at Epochs(1); the pass is 6 × 0.25 s.
        assert_eq!(
            c.report,
            [0.1, 0.7, over_sq, 3.0, sum, 6.0, 0.5, 2.0, 2.0, 1.5]
        );
        // numpy: position 0.8·3 = 2.4, so 3 + 0.4·(4 − 3).
        assert!((percentile(&[1.0, 2.0, 3.0, 4.0], 80.0) - 3.4).abs() < 1e-12);
        // Utility √(Σ ℓ² / n)·n over those 3; none over the threshold gives 0.
        assert_eq!(utility(&c.report), (over_sq / 3.0).sqrt() * 3.0);
        assert_eq!(utility(&stats(0.1, 0.2, 0.3, 3.0)), 0.0);
        // Without a clock, the six loss statistics only.
        let no_clock = ClientPlan {
            device: None,
            ..plan()
        };
        let c = rule(0.4, 1.5, 1.0, true).choose(0, &LOSSES, &no_clock, &mut rng);
        assert_eq!(c.report.len(), 6);
    }

    #[test]
    fn alg_2_moves_the_threshold_over_every_report_of_the_run() {
        let mut s = balancer(FedBalancerConfig::default(), 3, Some(vec![10.0; 3]));
        // Ratio 0 and threshold 0: it stays 0 whatever was reported.
        s.observe_samples(0, &[0], &[stats(0.2, 1.0, 1.0, 2.0)]);
        s.update_threshold();
        assert_eq!(s.state.loss_threshold, 0.0);
        // Ratio 0.5, after a second round's two reports: L = min(0.2, 0.1, 0.4) = 0.1 over
        // the whole run, H = mean(1, 2, 3) = 2: 0.1 + (2 − 0.1)·0.5 = 1.05.
        s.observe_samples(
            1,
            &[1, 2],
            &[stats(0.1, 2.0, 1.0, 2.0), stats(0.4, 3.0, 1.0, 2.0)],
        );
        s.state.lt_ratio = 0.5;
        s.update_threshold();
        assert_eq!(s.state.loss_threshold, 0.1 + (2.0 - 0.1) * 0.5);
        // Once it is non-zero, a ratio back at 0 gives L (the code's quirk).
        s.state.lt_ratio = 0.0;
        s.update_threshold();
        assert_eq!(s.state.loss_threshold, 0.1);
    }

    #[test]
    fn alg_3_steps_the_ratios_on_the_loss_per_second_windows() {
        // fb_w = 2, T = 10 s: each round's loss per second is (Σ / n) / 10. Rounds with
        // mean losses 4, 3, 2, 1: at the 4th (index 3, 3 mod 2 = 1) the windows are
        // (0.4, 0.3) and (0.2, 0.1), the reward 0.35 − 0.15 > 0: the threshold ratio rises
        // to 0.05 and the deadline ratio falls to 0.95. Before that, nothing moves.
        let cfg = FedBalancerConfig {
            fb_w: 2,
            ..FedBalancerConfig::default()
        };
        let mut s = balancer(cfg, 2, Some(vec![10.0, 10.0]));
        for (t, mean) in [4.0, 3.0, 2.0, 1.0].into_iter().enumerate() {
            assert_eq!(
                (s.state.lt_ratio, s.state.ddl_ratio),
                (0.0, 1.0),
                "round {t}"
            );
            s.observe_samples(t, &[0], &[stats(0.0, 0.0, 2.0 * mean, 2.0)]);
        }
        assert_eq!(s.state.round_losses, [0.4, 0.3, 0.2, 0.1]);
        assert_eq!((s.state.lt_ratio, s.state.ddl_ratio), (0.05, 0.95));
        // A round without reports records nothing and does not count.
        s.observe_samples(4, &[], &[]);
        assert_eq!(s.state.rounds, 4);
        // Losses rising over the next window: the reverse steps, 0.05 − 0.05 = 0 and
        // 0.95 + 0.05 = 1 (neither leaves [0, 1]).
        for mean in [5.0, 6.0] {
            s.observe_samples(5, &[0], &[stats(0.0, 0.0, mean, 1.0)]);
        }
        assert_eq!((s.state.lt_ratio, s.state.ddl_ratio), (0.0, 1.0));
    }

    #[test]
    fn alg_4_sets_the_deadline_at_the_peak_of_clients_done_per_second() {
        // Done at 2.5, 3 and 10 s: 2 clients by 3 s (2/3 a second) beats 3 by 10 s.
        assert_eq!(peak_deadline(&[2.5, 3.0, 10.0]), 3.0);
        assert_eq!(peak_deadline(&[0.2, 0.5]), 1.0);
        let mut s = balancer(
            FedBalancerConfig::default(),
            4,
            Some(vec![8.0, 6.0, 4.0, 2.0]),
        );
        // The first T is the mean registered round trip: (8 + 6 + 4 + 2) / 4 = 5.
        assert_eq!(s.round_deadline_s(), Some(5.0));
        let times = |transfer_s: f64, pass_s: f64, low: &[f64], high: &[f64]| {
            Some(Times {
                transfer_s,
                pass_s,
                low_s: low.to_vec(),
                high_s: high.to_vec(),
            })
        };
        // Expected times 2·transfer + pass + mean training: at one epoch 0.5 + 0.5 + 1.5 =
        // 2.5, 1 + 1 + 1 = 3 and 2 + 2 + 6 = 10; at the round's work 7, 6 and 24.
        s.state.times = vec![
            times(0.25, 0.5, &[1.0, 2.0], &[6.0]),
            times(0.5, 1.0, &[1.0], &[4.0]),
            times(1.0, 2.0, &[6.0], &[20.0]),
            None,
        ];
        s.state.loss_mins = vec![0.0];
        s.state.ddl_ratio = 0.5;
        // d_low = 3 (above); d_high: 1 by 6 s, 2 by 7 s (2/7), 3 by 24 s: 7. T = 3 + 4·0.5.
        s.update_deadline(&[0, 1, 2]);
        assert_eq!(s.round_deadline_s(), Some(5.0));
        s.state.ddl_ratio = 0.25;
        s.update_deadline(&[0, 1, 2]);
        assert_eq!(s.round_deadline_s(), Some(4.0));
        // A guard time of 1 s shifts every time: (3.5, 4, 11) peaks at 4 (2 by 4 s),
        // (8, 7, 25) at 8 (2 by 8 s): T = 4 + 4·0.25.
        s.state.guard_s = 1.0;
        s.update_deadline(&[0, 1, 2]);
        assert_eq!(s.round_deadline_s(), Some(5.0));
        // A client that never reported is expected at its registered round trip (2 s).
        s.state.guard_s = 0.0;
        s.update_deadline(&[3]);
        assert_eq!(s.round_deadline_s(), Some(2.0));
        // Two of four reported is not more than half: T stays.
        s.state.times[2] = None;
        s.update_deadline(&[0, 1]);
        assert_eq!(s.round_deadline_s(), Some(2.0));
        // Without a clock there is no deadline to move.
        let mut plain = balancer(FedBalancerConfig::default(), 2, None);
        plain.state.loss_mins = vec![0.0];
        plain.update_deadline(&[0, 1]);
        assert_eq!(plain.round_deadline_s(), None);
    }

    #[test]
    fn the_guard_time_grows_with_clients_dropped_twice_and_empty_rounds() {
        // K = 2: more than 0.2 clients dropped in two rounds running (one is enough).
        let mut s = balancer(FedBalancerConfig::default(), 4, Some(vec![1.0; 4]));
        let round = |s: &mut FedBalancer, selected: &[usize], dropped: &[usize]| {
            s.state.selected = [selected, dropped].concat();
            let bounds = vec![1.0; dropped.len()];
            s.observe(&Feedback {
                round: 0,
                selected,
                train_losses: &vec![1.0; selected.len()],
                updates: None,
                durations: Some(&vec![1.0; selected.len()]),
                dropped: Some(Dropped {
                    clients: dropped,
                    at_least_s: &bounds,
                }),
            });
            s.state.guard_s
        };
        assert_eq!(round(&mut s, &[0], &[1]), 0.0, "no round before");
        assert_eq!(round(&mut s, &[0], &[1, 2]), 10.0, "client 1 again");
        assert_eq!(
            round(&mut s, &[], &[1, 3]),
            30.0,
            "1 again, and nothing used"
        );
        assert_eq!(round(&mut s, &[0, 2], &[]), 0.0, "nobody dropped");
    }

    #[test]
    fn options_are_validated_by_name() {
        assert!(FedBalancerConfig::default().validate().is_ok());
        let d = FedBalancerConfig::default;
        for (cfg, key) in [
            (FedBalancerConfig { fb_p: 1.5, ..d() }, "fb_p"),
            (FedBalancerConfig { fb_w: 0, ..d() }, "fb_w"),
            (
                FedBalancerConfig {
                    fb_simple_control_lt_stepsize: -0.1,
                    ..d()
                },
                "fb_simple_control_lt_stepsize",
            ),
            (
                FedBalancerConfig {
                    noise_factor: f64::NAN,
                    ..d()
                },
                "noise_factor",
            ),
            (
                FedBalancerConfig {
                    fb_inference_pipelining: true,
                    ..d()
                },
                "fb_inference_pipelining",
            ),
        ] {
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn a_bad_value_in_the_config_is_an_error_naming_its_key() {
        use crate::config::Config;
        let e = Config::from_toml_str(
            "[selection]\nstrategy = \"fedbalancer\"\n[selection.fedbalancer]\nfb_w = 0\n",
            "test",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("selection.fedbalancer.fb_w"), "{e}");
        let ok = Config::from_toml_str(
            "[selection]\nstrategy = \"fedbalancer\"\n[selection.fedbalancer]\nfb_p = 0.8\n",
            "test",
            &[],
        )
        .unwrap();
        assert!(ok.to_resolved_toml().contains("fb_p = 0.8"));
    }
}

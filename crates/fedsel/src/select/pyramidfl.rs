//! PyramidFL (Li, Zeng, Zhang & Cao, MobiCom'22): Oort's selection from the server's view,
//! refined inside the selected set with what the server knows of each client's device and
//! its last update. Code: liecn/PyramidFL @ dd1d143, `training/param_server.py`
//! (`prune_client_tasks`, the score registration in `run`), `training/learner.py`
//! (`run_client`) and `oort/oort.py`; its option names and defaults (`training/argParser.py`)
//! are the keys of `[selection.pyramidfl]`.
//!
//! Each round, with K the round's budget:
//! 1. **Rank (Oort).** Oort's training selector picks ⌊K·`overcommit`⌋ clients (the code's
//!    `resampleClients(int(total_worker · overcommit))`). fedsel's [`Oort`] runs it (under
//!    `code` in PyramidFL's copy, see Protocols), with the options of `[selection.pyramidfl.oort]`, whose defaults are PyramidFL's
//!    (its `argParser.py` differs from FedScale's: ε decays by 0.95 to 0.2, T at the 10th
//!    percentile, clip at 0.98, cut-off 0.7).
//! 2. **Keep the fastest.** Of those, the K whose registered round trip ([`DeviceReport`],
//!    the code's `getCompletionTime` from the device profile) is shortest train; the others
//!    are not run (`prune_client_tasks` step 3).
//! 3. **Upload dropout** (`enable_dropout`). The kept clients are ranked by gradient
//!    utility, highest first, ties sharing the higher rank (the code's
//!    `rewardListSorted.index`); the client of rank r drops the fraction
//!    `dropout_low` + r·(`dropout_high` − `dropout_low`)/K of its update, so the clients
//!    whose updates move the model most send the most (param_server.py lines 171-180). Its
//!    predicted round trip becomes t_k = compute + (1 − r_k)·(download + upload) (`code`;
//!    `paper` shrinks the upload alone), and the round's T their maximum.
//! 4. **Local work** (`enable_adapt_local_epoch`). A client that would wait for the round
//!    trains more: with c_k its compute for its E_k steps of `train.work`, it gets the
//!    multiplier m_k = min(10, β·⌊(T − t_k)/(c_k/E_k)⌋/E_k) + 1 (param_server.py line 185,
//!    β = `adaptive_epoch_beta`), its steps capped at five passes over the client's data
//!    (learner.py line 232; see Protocols, *Steps*). β ≤ 1 keeps every kept client within T.
//!
//! The engine carries out the orders ([`ClientOrder`]): ⌊E_k·m_k⌋ steps, the dropout as
//! [`UploadDropout`], the clock charged for both, and the dropped coordinates aggregated as
//! no change under the client's full weight, as the code's server sums the zeroed deltas.
//!
//! **Protocols.** `code` (the default) is PyramidFL's selection as liecn/PyramidFL @
//! dd1d143 runs it; `paper` is fedsel's earlier reading, kept where the paper is silent on
//! what the code does (the paper gives no Oort internals, no registration of the clients it
//! does not run, no step rounding). They differ in:
//! - *Oort.* `code` runs PyramidFL's own copy of Oort's training selector
//!   (`OortCopy::PyramidFl` in oort.rs: a uniform first round, ⌊K(1 − ε)⌋ exploitation admitted
//!   without FedScale's floor of ten times the share, uniform filling, ε held at 0 once
//!   nobody is left to explore, stamps offset by the code's warm-up epoch); `paper` runs
//!   the `oort` strategy's FedScale copy with its departures ([`Oort`]'s module doc).
//! - *Registration.* `code` registers, after each round, every client it ran with the
//!   statistical utility √(ℓ²)·min(n_k, s_k) (param_server.py line 345; here |ℓ̄|, the
//!   mean loss the feedback carries, for the root of the mean squared loss) and its
//!   *registered* round trip (the code's `virtualClientClock`, line 334: the profile's
//!   compute and transfer for the run's own work), never the time it measured, which
//!   includes the extra steps PyramidFL itself ordered; and each over-committed client it
//!   pruned with the round's mean utilities (lines 437-442, `is_even_avg`: the plain mean
//!   over the clients it ran) and its registered round trip, as tried. `paper` lets Oort
//!   learn n_k·|ℓ̄| and the measured round trips, and leaves the pruned untried.
//! - *Dropout.* `code` drops each parameter tensor whole with probability r_k
//!   ([`UploadDropout::Layers`], learner.py line 419), the rate read back from the
//!   float32 broadcast, and shrinks the whole transfer by 1 − r_k in the predicted round
//!   trip (param_server.py line 179: the code's one communication term); `paper` drops the
//!   fraction r_k of the coordinates whose change is smallest ([`UploadDropout::Smallest`],
//!   the magnitude-based dropout issue 42 describes for the paper, not checked against the
//!   paper's text here) and shrinks the upload alone.
//! - *Steps.* `code` gives the steps the code's learner trains: the multiplier cast to
//!   float32 (the broadcast tensor, param_server.py line 542), ⌊E·m⌋ truncated from it
//!   (learner.py line 539), capped at max(5·⌊n_k/B⌋, E) (line 232, its loader of full
//!   batches; n_k the size the client reported), so ⌊10·1.9⌋ is 18, not 19; `paper`
//!   computes ⌊E·m⌋ in float64 under the cap max(5·⌈n_k/B⌉, E).
//! - *Ties.* `code` sorts Oort's picks by id before the stable sort by round trip (the
//!   code's `sorted(resampleClients(..))`); `paper` keeps Oort's order.
//!
//! Measured beside the code (`scripts/reference/pyramidfl_authors.py`: 200 clients,
//! K = 20, 300 rounds, 20 seeds; total-variation distance of the trained clients'
//! selection frequencies against the code's own seed-to-seed one): `code` lies at 0.010
//! against 0.011 (federation 1), 0.012 against 0.008 (2; 0.011 against 0.007 over 40
//! seeds) and 0.009 against 0.009 (3), the fastest fifth taking 94.0 % of fedsel's
//! trained picks and 93.9 % of the code's (federation 1; 93.3 % and 92.8 % in 2, 95.3 %
//! and 95.1 % in 3); `paper`, 0.722 and 21.8 %. Federation 2's excess is seed noise, not
//! a difference: it is the federation whose pacer moves T early (the change between its
//! windows falls within 10 % from round 80 in about 2 % of seeds, and by round 300 T has
//! moved in about half of them), and a moved T shifts the whole run, so a few seeds weigh
//! heavily in any 20 or 40. Over 400 seeds fedsel lies at 0.0036 against the code's own
//! 0.0029 (seeds 1-200: 0.0088 against 0.0032; seeds 201-400: 0.0030 against 0.0051), its
//! per-client χ²/dof 0.96 against the code's own 0.87; with the pacer off on both sides
//! 0.0037 against 0.0040 (100 seeds), and at T held at the 5th, 15th and 25th
//! percentile the ratio is 1.10, 0.93 and 1.01. The pacer's records agree round by round
//! (rounds 1-40 over 1,000 seeds, 1-280 over 600) once the exhausting round's uniform
//! fills are counted as the code counts them (`OortCopy::PyramidFl` in oort.rs; that
//! record only enters round 40's comparison, which moves T in no seed here, so the
//! figures above are unchanged by it). In lockstep (fedsel's selection handed to the
//! code, no over-commitment) the 120,000 ordered step counts and dropout ratios agree
//! exactly.
//!
//! The gradient utility of a client that reported is ‖Δ_k‖·min(n_k, s_k)/100 under both,
//! s_k the samples it was ordered to train this round (steps·B), and n_k before it
//! trained (the code's `registerScore` with `size_of_sample_bin`, param_server.py lines
//! 337-346, and its prior `gradient: size` in `clientSampler.py`).
//!
//! **Departures from the code**, under both protocols, each because fedsel's server
//! cannot or need not do what the code does:
//! - *Gradient norm.* The code's norm is ‖Δ_k − w‖ (param_server.py line 331 subtracts the
//!   broadcast model from the delta), which is nearly ‖w‖ for every client; here ‖Δ_k‖, the
//!   gradient norm the code's variable names mean. A selector is not handed the model. It
//!   only orders the dropouts; a reviewer measured no effect on the selection.
//! - *The warm-up epoch.* The code's server first runs one client per learner process
//!   (its clients 1..4 under the default `--learners 1-2-3-4`, param_server.py lines
//!   119-127), registered with the placeholder duration 1 s; fedsel's rounds start with
//!   the uniform round. The stamps keep the code's numbering (round index t is epoch t + 2).
//!   The code run with it: 0.009 against its own 0.009 (federation 1), no effect seen.
//! - *Clock.* fedsel's engine charges the clock for the work and upload a client actually
//!   does (the download whole); the code's virtual clock adds its predicted round. Only
//!   the reported times differ; the selection reads the registered round trips.
//! - *Availability.* The code also drops candidates that a behave trace says will be
//!   offline when they finish, which a server cannot foresee; here the engine loses them.
//! - *Filtered clients.* The code registers only clients of 32 to 10⁵ examples
//!   (`filter_less`, `filter_more`); fedsel selects among all.
//! - *The engine's over-commitment.* PyramidFL over-commits inside itself; a config that
//!   also sets `system.round.policy = "overcommit"` with `overcommit` > 1 here is refused
//!   (`system.round.overcommit`), since it would pick ⌊1.3·⌈1.3K⌉⌋ and prune twice. With
//!   `overcommit = 1` the engine's over-commitment replaces PyramidFL's own, and under
//!   `code` a client the engine dropped only has its known duration raised to the round's
//!   cut.

use serde::{Deserialize, Deserializer, Serialize};

use super::oort::{Oort, OortConfig, OortCopy, Trial};
use super::{
    ClientOrder, ClientQuery, DeviceReport, Feedback, Needs, Planned, Protocol, RoundContext,
    Selection, Selector, Setup, UpdateKind, UploadDropout,
};
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use crate::validate::{check, check_prob};

/// PyramidFL's options: the code's names and defaults (`training/argParser.py`), with both
/// of its mechanisms on, as every `conf_ours.yml` of the repository runs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PyramidflConfig {
    /// `code` follows the authors' selection (their Oort copy, pruned clients registered,
    /// registered round trips, their utilities and step counts); `paper` is fedsel's
    /// earlier reading, FedScale's Oort and magnitude dropout (see the module doc).
    /// Defaults to `code`: it produced the tables.
    pub protocol: Protocol,
    /// Oort picks ⌊K·overcommit⌋ clients and the K fastest train (1.3).
    pub overcommit: f64,
    /// Fast clients train more local steps (on in every `conf_ours.yml`; off in argParser).
    pub enable_adapt_local_epoch: bool,
    /// β of the step multiplier (1).
    pub adaptive_epoch_beta: f64,
    /// Clients drop part of their update by gradient utility (on in every
    /// `conf_ours.yml`; off in argParser).
    pub enable_dropout: bool,
    /// The dropout of the highest gradient utility (0.1).
    pub dropout_low: f64,
    /// The dropout the ranks climb towards (0.6).
    pub dropout_high: f64,
    /// Oort's options, with PyramidFL's defaults: a table that sets some keys keeps
    /// PyramidFL's defaults for the others.
    #[serde(deserialize_with = "over_pyramidfl_defaults")]
    pub oort: OortConfig,
}

/// `[selection.pyramidfl.oort]` as given, each key it leaves out at PyramidFL's default
/// (not FedScale's, which a plain `default` of [`OortConfig`] would give).
fn over_pyramidfl_defaults<'de, D: Deserializer<'de>>(d: D) -> Result<OortConfig, D::Error> {
    use serde::de::Error as _;
    use serde_json::{Map, Value};
    let given = Map::<String, Value>::deserialize(d)?;
    let mut merged = match serde_json::to_value(PyramidflConfig::default().oort) {
        Ok(Value::Object(m)) => m,
        Ok(other) => return Err(D::Error::custom(format!("Oort's defaults as {other}"))),
        Err(e) => return Err(D::Error::custom(e)),
    };
    merged.extend(given);
    serde_json::from_value(Value::Object(merged)).map_err(D::Error::custom)
}

impl Default for PyramidflConfig {
    fn default() -> Self {
        Self {
            protocol: Protocol::Code,
            overcommit: 1.3,
            enable_adapt_local_epoch: true,
            adaptive_epoch_beta: 1.0,
            enable_dropout: true,
            dropout_low: 0.1,
            dropout_high: 0.6,
            oort: OortConfig {
                exploration_factor: 0.9,
                exploration_decay: 0.95,
                exploration_min: 0.2,
                round_threshold: 10.0,
                round_penalty: 2.0,
                clip_bound: 0.98,
                blacklist_rounds: -1,
                blacklist_max_len: 0.3,
                cut_off_util: 0.7,
                pacer_delta: 5.0,
                pacer_step: 20,
                sample_window: 5.0,
                ..OortConfig::default()
            },
        }
    }
}

impl PyramidflConfig {
    /// Whether every option has its default (the config then leaves the table out).
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks every option, naming the key it refuses.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check(
            self.overcommit.is_finite() && self.overcommit >= 1.0,
            "selection.pyramidfl.overcommit",
            format!("{} must be finite and ≥ 1", self.overcommit),
        )?;
        check(
            self.adaptive_epoch_beta.is_finite() && self.adaptive_epoch_beta >= 0.0,
            "selection.pyramidfl.adaptive_epoch_beta",
            format!("{} must be finite and ≥ 0", self.adaptive_epoch_beta),
        )?;
        check_prob(
            self.dropout_low,
            "selection.pyramidfl.dropout_low",
            false,
            true,
        )?;
        check_prob(
            self.dropout_high,
            "selection.pyramidfl.dropout_high",
            false,
            true,
        )?;
        check(
            self.dropout_low <= self.dropout_high,
            "selection.pyramidfl.dropout_low",
            format!(
                "{} is above dropout_high = {}",
                self.dropout_low, self.dropout_high
            ),
        )?;
        self.oort.validate().map_err(|e| match e {
            ConfigError::Invalid { key, reason } => ConfigError::Invalid {
                key: key.replace("selection.oort", "selection.pyramidfl.oort"),
                reason,
            },
            other => other,
        })
    }
}

/// What PyramidFL adds to Oort's state, checkpointed with it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
struct State {
    /// Oort's own state.
    oort: serde_json::Value,
    /// Each client's gradient utility: n_k before it trained.
    gradient: Vec<f64>,
    /// The samples each client was ordered to train in its last selection.
    ordered_samples: Vec<u64>,
    /// `code`: the last plan's over-committed clients that were not run.
    #[serde(default)]
    pruned: Vec<usize>,
    /// `code`: how many clients the last plan ran (the code's mean divides by them).
    #[serde(default)]
    ran: usize,
}

/// The PyramidFL selector.
#[derive(Debug, Clone)]
pub struct PyramidFl {
    cfg: PyramidflConfig,
    oort: Oort,
    sizes: Vec<usize>,
    devices: Option<Vec<DeviceReport>>,
    gradient: Vec<f64>,
    ordered_samples: Vec<u64>,
    pruned: Vec<usize>,
    ran: usize,
}

/// One kept client's orders and the predictions they came from.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Refined {
    /// The fraction of its update it drops (0 without dropout).
    dropout: f64,
    /// Its predicted round trip with that dropout, t_k.
    finish_s: f64,
    /// Its local-work multiplier m_k (1 without adaptation).
    work: f64,
}

impl PyramidFl {
    /// A selector with the given options.
    pub fn new(cfg: PyramidflConfig) -> Self {
        let copy = match cfg.protocol {
            Protocol::Code => OortCopy::PyramidFl,
            Protocol::Paper => OortCopy::FedScale,
        };
        let oort = Oort::with_copy(cfg.oort.clone(), copy);
        Self {
            cfg,
            oort,
            sizes: Vec::new(),
            devices: None,
            gradient: Vec::new(),
            ordered_samples: Vec::new(),
            pruned: Vec::new(),
            ran: 0,
        }
    }

    fn code(&self) -> bool {
        self.cfg.protocol == Protocol::Code
    }

    /// `code`: each device's registered round trip goes to Oort, as the code's
    /// `registerDuration` does at registration (clientSampler.py lines 63-68).
    fn register_round_trips(&mut self) {
        if let (true, Some(devices)) = (self.code(), &self.devices) {
            let trips: Vec<f64> = devices.iter().map(round_trip).collect();
            self.oort.register_durations(&trips);
        }
    }

    /// `code`: the steps client `k` trains when ordered multiplier `work`, as the code's
    /// learner computes them: the server broadcasts the ratio as a float32 tensor
    /// (param_server.py line 542), the learner truncates `int(upload_epoch · ratio)`
    /// (learner.py line 539) and caps it at max(5·len(loader), upload_epoch) (line 232),
    /// its loader's length ⌊n_k/B⌋ (full batches only).
    fn code_steps(&self, k: usize, device: &DeviceReport, work: f64) -> u64 {
        let e = device.steps.max(1) as u64;
        let ordered = (e as f64 * f64::from(work as f32)).floor() as u64;
        let loader = (self.sizes[k] / device.batch.max(1)) as u64;
        ordered.min((5 * loader).max(e)).max(1)
    }

    /// ‖Δ_k‖·min(n_k, s_k)/100 (param_server.py line 346).
    fn gradient_utility(&self, k: usize, update: &[f32]) -> f64 {
        let norm = update
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt();
        let bin = (self.sizes[k] as u64).min(self.ordered_samples[k]) as f64;
        norm * bin / 100.0
    }

    /// `code`: the server's registration (param_server.py lines 337-356 and 437-442).
    /// Each reporting client is registered with the statistical utility
    /// √(ℓ²)·min(n_k, s_k), here |ℓ̄|·min(n_k, s_k), and its registered round trip (the
    /// code's `virtualClientClock`, not the time it took); each client the last plan
    /// pruned, with the mean over the clients it ran (`is_even_avg`) of both utilities and
    /// its own registered round trip. A client the engine dropped (a deadline) only has
    /// its known duration raised to the bound, as the `oort` strategy does.
    fn observe_code(&mut self, f: &Feedback<'_>) {
        let Some(devices) = self.devices.as_ref() else {
            return;
        };
        let mut trials = Vec::with_capacity(f.selected.len() + self.pruned.len());
        let (mut utility, mut gradient) = (0.0, 0.0);
        for (i, (&k, &loss)) in f.selected.iter().zip(f.train_losses).enumerate() {
            let bin = (self.sizes[k] as u64).min(self.ordered_samples[k]) as f64;
            let reward = loss.abs() * bin;
            utility += reward;
            trials.push(Trial {
                client: k,
                reward,
                duration_s: round_trip(&devices[k]),
            });
            if let Some(u) = f.updates.and_then(|u| u.get(i)) {
                self.gradient[k] = self.gradient_utility(k, u);
                gradient += self.gradient[k];
            }
        }
        let ran = self.ran.max(1) as f64;
        for &k in &self.pruned {
            trials.push(Trial {
                client: k,
                reward: utility / ran,
                duration_s: round_trip(&devices[k]),
            });
            if f.updates.is_some() {
                self.gradient[k] = gradient / ran;
            }
        }
        self.oort.register_trials(f.round, &trials);
        if let Some(d) = f.dropped {
            for (&k, &bound) in d.clients.iter().zip(d.at_least_s) {
                self.oort.censor(k, bound);
            }
        }
        self.pruned.clear();
    }
    /// Each kept client's dropout, predicted round trip and work multiplier (steps 3 and
    /// 4 of the module doc), for a round of budget `budget` (the code's `total_worker`).
    fn refine(&self, kept: &[usize], devices: &[DeviceReport], budget: usize) -> Vec<Refined> {
        let cfg = &self.cfg;
        let step = (cfg.dropout_high - cfg.dropout_low) / budget.max(1) as f64;
        let mut out: Vec<Refined> = kept
            .iter()
            .map(|&k| {
                let d = &devices[k];
                let dropout = if cfg.enable_dropout {
                    let g = self.gradient[k];
                    let rank = kept.iter().filter(|&&j| self.gradient[j] > g).count();
                    cfg.dropout_low + rank as f64 * step
                } else {
                    0.0
                };
                // `code`: the whole transfer shrinks with the dropout (param_server.py line
                // 179, its one communication term); `paper`: the upload alone.
                let finish_s = if self.code() {
                    d.compute_s + (1.0 - dropout) * (d.download_s + d.upload_s)
                } else {
                    d.download_s + d.compute_s + (1.0 - dropout) * d.upload_s
                };
                Refined {
                    dropout,
                    finish_s,
                    work: 1.0,
                }
            })
            .collect();
        if !cfg.enable_adapt_local_epoch {
            return out;
        }
        let round_s = out.iter().map(|r| r.finish_s).fold(0.0, f64::max);
        for (r, &k) in out.iter_mut().zip(kept) {
            let d = &devices[k];
            let e = d.steps.max(1) as f64;
            let per_step = d.compute_s / e;
            let fits = if per_step > 0.0 {
                ((round_s - r.finish_s) / per_step).floor()
            } else {
                0.0
            };
            let work = (cfg.adaptive_epoch_beta * fits / e).min(10.0) + 1.0;
            r.work = capped(work, d);
        }
        out
    }
}

/// `work` for a client of `device`, lowered where ⌊E·work⌋ steps would pass its cap of
/// max(5·⌈n/B⌉, E) steps (learner.py line 232) to the least multiplier that gives the cap.
fn capped(work: f64, device: &DeviceReport) -> f64 {
    let e = device.steps.max(1);
    let cap = (5 * device.epoch_steps).max(e);
    if (e as f64 * work).floor() as usize <= cap {
        return work;
    }
    least_multiplier(cap as u64, e as u64)
}

/// The least multiplier w with ⌊E·w⌋ = `steps` (the engine trains ⌊E·w⌋ steps).
fn least_multiplier(steps: u64, e: u64) -> f64 {
    let e = e.max(1) as f64;
    let mut w = steps as f64 / e;
    while ((e * w).floor() as u64) < steps {
        w = w.next_up();
    }
    w
}

/// A device's registered round trip: the code's `getCompletionTime`, its local compute
/// plus its whole transfer (clientSampler.py lines 262-269).
fn round_trip(d: &DeviceReport) -> f64 {
    d.download_s + d.compute_s + d.upload_s
}

impl Selector for PyramidFl {
    fn name(&self) -> &'static str {
        "pyramidfl"
    }

    /// The whole update, for its norm (the gradient utility).
    fn needs(&self) -> Needs {
        Needs {
            updates: UpdateKind::Full,
            ..Needs::default()
        }
    }

    fn setup(&mut self, setup: &Setup) {
        self.oort.setup(setup);
        self.sizes = setup.sizes.clone();
        self.gradient = setup.sizes.iter().map(|&s| s as f64).collect();
        self.ordered_samples = vec![0; setup.sizes.len()];
        self.pruned.clear();
        self.ran = 0;
        self.register_round_trips();
    }

    fn register_devices(&mut self, devices: &[DeviceReport]) {
        self.devices = Some(devices.to_vec());
        self.register_round_trips();
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        self.plan(ctx, query, rng).map(|p| p.selection)
    }

    fn plan(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Planned, Error> {
        let Some(devices) = self.devices.clone() else {
            return Err(Error::Selection {
                selector: "pyramidfl".into(),
                round: ctx.round,
                reason: "needs the clients' device profiles: run it with a [system] clock".into(),
            });
        };
        let k = ctx.budget.min(ctx.available.len());
        let wide = ((ctx.budget as f64 * self.cfg.overcommit) as usize)
            .min(ctx.available.len())
            .max(k);
        let over = RoundContext {
            budget: wide,
            ..*ctx
        };
        let mut candidates = self.oort.select(&over, query, rng)?.clients;
        if self.code() {
            // The code sorts Oort's picks by id (param_server.py line 466), so equal round
            // trips keep the lower id first.
            candidates.sort_unstable();
        }
        // A stable sort: equal round trips keep the order before it.
        candidates.sort_by(|&a, &b| round_trip(&devices[a]).total_cmp(&round_trip(&devices[b])));
        let pruned = candidates.split_off(k);
        let refined = self.refine(&candidates, &devices, ctx.budget);
        let code = self.code();
        let mut orders = Vec::with_capacity(candidates.len());
        for (&c, r) in candidates.iter().zip(&refined) {
            let d = &devices[c];
            let (steps, work) = if code {
                let steps = self.code_steps(c, d, r.work);
                (steps, least_multiplier(steps, d.steps as u64))
            } else {
                (((d.steps as f64 * r.work).floor() as u64).max(1), r.work)
            };
            self.ordered_samples[c] = steps * d.batch as u64;
            // `code`: the learner reads the ratio from the float32 broadcast (line 544).
            let rate = if code {
                f64::from(r.dropout as f32)
            } else {
                r.dropout
            };
            orders.push(ClientOrder {
                work,
                dropout: self.cfg.enable_dropout.then_some(match self.cfg.protocol {
                    Protocol::Paper => UploadDropout::Smallest(rate),
                    Protocol::Code => UploadDropout::Layers(rate),
                }),
            });
        }
        if code {
            self.pruned = pruned;
            self.ran = candidates.len();
        }
        Ok(Planned {
            selection: Selection {
                clients: candidates,
                weights: None,
            },
            orders: Some(orders),
        })
    }

    /// `paper`: Oort learns as it does alone. `code`: see [`PyramidFl::observe_code`].
    /// Each reporting client's gradient utility becomes ‖Δ_k‖·min(n_k, s_k)/100.
    fn observe(&mut self, f: &Feedback<'_>) {
        if self.code() {
            self.observe_code(f);
            return;
        }
        self.oort.observe(f);
        let Some(updates) = f.updates else {
            return;
        };
        for (&k, u) in f.selected.iter().zip(updates) {
            self.gradient[k] = self.gradient_utility(k, u);
        }
    }

    fn save(&self) -> serde_json::Value {
        super::save_state(&State {
            oort: self.oort.save(),
            gradient: self.gradient.clone(),
            ordered_samples: self.ordered_samples.clone(),
            pruned: self.pruned.clone(),
            ran: self.ran,
        })
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let loaded: State = super::load_state("pyramidfl", state)?;
        let n = self.sizes.len();
        super::check_loaded("pyramidfl", "gradient utilities", loaded.gradient.len(), n)?;
        super::check_loaded(
            "pyramidfl",
            "ordered samples",
            loaded.ordered_samples.len(),
            n,
        )?;
        if let Some(&k) = loaded.pruned.iter().find(|&&k| k >= n) {
            return Err(Error::Selection {
                selector: "pyramidfl".into(),
                round: 0,
                reason: format!("the loaded state names client {k} of {n}"),
            });
        }
        self.oort.load(&loaded.oort)?;
        self.gradient = loaded.gradient;
        self.ordered_samples = loaded.ordered_samples;
        self.pruned = loaded.pruned;
        self.ran = loaded.ran;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::testing::{FixedLosses, setup};

    /// Download and upload 1 s each; compute 2, 4, 8 and 20 s for E = 10 steps of batch
    /// 10; 100 steps an epoch (no cap).
    fn devices() -> Vec<DeviceReport> {
        [2.0, 4.0, 8.0, 20.0]
            .iter()
            .map(|&compute_s| DeviceReport {
                download_s: 1.0,
                compute_s,
                upload_s: 1.0,
                steps: 10,
                epoch_steps: 100,
                batch: 10,
            })
            .collect()
    }

    fn pyramid(cfg: PyramidflConfig) -> PyramidFl {
        let mut s = PyramidFl::new(cfg);
        s.setup(&Setup {
            sizes: vec![100, 300, 200, 400],
            ..setup(&[0.25; 4])
        });
        s.register_devices(&devices());
        s
    }

    fn plan(s: &mut PyramidFl, budget: usize) -> Planned {
        let ctx = RoundContext {
            round: 0,
            available: &[0, 1, 2, 3],
            budget,
            clock_s: None,
        };
        let mut rng = stream(1, Purpose::Selection, 0, 0);
        s.plan(&ctx, &mut FixedLosses(vec![1.0; 4]), &mut rng)
            .unwrap()
    }

    /// `paper`. K = 3 with over-commitment 1.34: Oort's first round explores ⌊3·1.34⌋ = 4 clients,
    /// all of them, and the 3 of shortest round trip (4, 6, 10 s; client 3 takes 22 s) are
    /// kept. Their gradient utilities are still their sizes (100, 300, 200): ranks 2, 0, 1,
    /// dropouts 0.1 + r·0.5/3 = 0.4333, 0.1, 0.2667. Round trips 1 + c + (1 − r)·1 =
    /// 3.5667, 5.9, 9.7333 s, so T = 9.7333 s; at 0.2, 0.4, 0.8 s a step, client 0 fits
    /// ⌊6.1667/0.2⌋ = 30 more steps: m = min(10, 30/10) + 1 = 4; client 1 fits
    /// ⌊3.8333/0.4⌋ = 9: m = 1.9; client 2, the slowest, none: m = 1.
    #[test]
    fn keeps_the_fastest_and_orders_dropout_by_rank_and_steps_by_slack() {
        let cfg = PyramidflConfig {
            protocol: Protocol::Paper,
            overcommit: 1.34,
            ..PyramidflConfig::default()
        };
        let mut s = pyramid(cfg);
        let p = plan(&mut s, 3);
        assert_eq!(p.selection.clients, [0, 1, 2]);
        let orders = p.orders.unwrap();
        let rate = |i: usize| match orders[i].dropout {
            Some(UploadDropout::Smallest(r)) => r,
            other => panic!("paper protocol drops the smallest changes, got {other:?}"),
        };
        let third = 0.5 / 3.0;
        for (i, want) in [0.1 + 2.0 * third, 0.1, 0.1 + third]
            .into_iter()
            .enumerate()
        {
            assert!((rate(i) - want).abs() < 1e-12, "entry {i}: {}", rate(i));
        }
        let works: Vec<f64> = orders.iter().map(|o| o.work).collect();
        assert_eq!(works[0], 4.0);
        assert!((works[1] - 1.9).abs() < 1e-12, "{}", works[1]);
        assert_eq!(works[2], 1.0);
        // The samples each was ordered: ⌊10·m⌋ steps of 10.
        assert_eq!(s.ordered_samples[..3], [400, 190, 100]);
    }

    /// A client of one batch an epoch may train at most max(5·1, E = 10) = 10 steps
    /// (the client's own cap): client 0's m = 4 becomes 1.
    #[test]
    fn the_step_multiplier_stops_at_five_passes_over_the_data() {
        let cfg = PyramidflConfig {
            protocol: Protocol::Paper,
            overcommit: 1.34,
            ..PyramidflConfig::default()
        };
        let mut s = pyramid(cfg);
        let mut d = devices();
        d[0].epoch_steps = 1;
        s.register_devices(&d);
        let orders = plan(&mut s, 3).orders.unwrap();
        assert_eq!(orders[0].work, 1.0);
        // A cap that is not a whole multiple of E: 5·3 = 15 steps of E = 10.
        d[0].epoch_steps = 3;
        let w = capped(4.0, &d[0]);
        assert_eq!((10.0 * w).floor(), 15.0);
        assert!((w - 1.5).abs() < 1e-12);
    }

    /// The gradient utility of a reporting client is ‖Δ‖·min(n_k, s_k)/100: client 0
    /// (n = 100, ordered 400 samples) reports Δ = (3, 4): 5·100/100 = 5; client 1
    /// (n = 300, ordered 190) reports (0, 1): 1·190/100 = 1.9. The next round ranks by
    /// them: client 2 (still its size, 200) first, then 0 and 1.
    #[test]
    fn gradient_utility_is_the_update_norm_times_the_samples_trained() {
        let cfg = PyramidflConfig {
            protocol: Protocol::Paper,
            overcommit: 1.34,
            ..PyramidflConfig::default()
        };
        let mut s = pyramid(cfg);
        plan(&mut s, 3);
        let updates = vec![vec![3.0, 4.0], vec![0.0, 1.0]];
        s.observe(&Feedback {
            round: 0,
            selected: &[0, 1],
            train_losses: &[0.5, 0.5],
            updates: Some(&updates),
            durations: Some(&[3.0, 5.0]),
            dropped: None,
        });
        assert_eq!(s.gradient[0], 5.0);
        assert!((s.gradient[1] - 1.9).abs() < 1e-12);
        assert_eq!(s.gradient[2..], [200.0, 400.0]);
        let r = s.refine(&[0, 1, 2], &devices(), 3);
        let third = 0.5 / 3.0;
        assert!((r[0].dropout - (0.1 + third)).abs() < 1e-12);
        assert!((r[1].dropout - (0.1 + 2.0 * third)).abs() < 1e-12);
        assert!((r[2].dropout - 0.1).abs() < 1e-12);
        // Checkpointed and restored whole.
        let mut again = pyramid(PyramidflConfig {
            protocol: Protocol::Paper,
            ..PyramidflConfig::default()
        });
        again.load(&s.save()).unwrap();
        assert_eq!(again.gradient, s.gradient);
        assert_eq!(again.ordered_samples, s.ordered_samples);
        assert_eq!(again.oort.save(), s.oort.save());
    }

    /// `paper` drops the smallest changes; with both mechanisms off, PyramidFL orders
    /// nothing beyond its selection; without a clock it refuses to select.
    #[test]
    fn protocols_switches_and_the_clock_requirement() {
        let mut s = pyramid(PyramidflConfig {
            protocol: Protocol::Paper,
            ..PyramidflConfig::default()
        });
        let orders = plan(&mut s, 2).orders.unwrap();
        assert!(
            orders
                .iter()
                .all(|o| matches!(o.dropout, Some(UploadDropout::Smallest(_))))
        );
        let mut s = pyramid(PyramidflConfig {
            enable_dropout: false,
            enable_adapt_local_epoch: false,
            ..PyramidflConfig::default()
        });
        let orders = plan(&mut s, 2).orders.unwrap();
        assert!(orders.iter().all(|o| *o == ClientOrder::FULL));
        let mut s = PyramidFl::new(PyramidflConfig::default());
        s.setup(&setup(&[0.5, 0.5]));
        let ctx = RoundContext {
            round: 0,
            available: &[0, 1],
            budget: 1,
            clock_s: None,
        };
        let mut rng = stream(1, Purpose::Selection, 0, 0);
        let e = s
            .plan(&ctx, &mut FixedLosses(vec![1.0; 2]), &mut rng)
            .unwrap_err();
        assert!(e.to_string().contains("[system]"), "{e}");
    }

    /// `code`, K = 3 with over-commitment 1.34: the uniform first round draws all 4, the 3
    /// of shortest registered round trip (4, 6, 10 s; client 3 takes 22 s) run and client
    /// 3 is pruned. Dropouts by rank as under `paper` (0.4333, 0.1, 0.2667), but each
    /// shrinks the whole transfer of 2 s: t = 2 + 0.5667·2 = 3.1333, 4 + 0.9·2 = 5.8,
    /// 8 + 0.7333·2 = 9.4667 = T. Client 0 fits ⌊6.3333/0.2⌋ = 31 more steps: m = 4.1,
    /// whose float32 is 4.0999999 and ⌊10·m⌋ = 40 steps (41 in float64); client 1 fits
    /// ⌊3.6667/0.4⌋ = 9: m = 1.9, 18 steps (19 in float64); client 2 trains its own 10.
    /// Reports of losses 0.5, 1, 2 register 0.5·min(100, 400) = 50, 1·min(300, 180) = 180
    /// and 2·min(200, 100) = 200, each at its registered round trip whatever it measured;
    /// the pruned client 3 gets their mean over the 3 run, 143.33, and the mean gradient
    /// utility (5 + 1.8 + 2)/3, stamped with the round's epoch 2 and counted as tried.
    #[test]
    fn code_registers_the_pruned_with_the_round_mean_and_counts_steps_as_the_learner() {
        let mut s = pyramid(PyramidflConfig {
            overcommit: 1.34,
            ..PyramidflConfig::default()
        });
        let p = plan(&mut s, 3);
        assert_eq!(p.selection.clients, [0, 1, 2]);
        assert_eq!(s.pruned, [3]);
        let orders = p.orders.unwrap();
        let steps: Vec<f64> = orders.iter().map(|o| (10.0 * o.work).floor()).collect();
        assert_eq!(steps, [40.0, 18.0, 10.0]);
        assert_eq!(orders[2].work, 1.0);
        assert_eq!(s.ordered_samples[..3], [400, 180, 100]);
        let updates = vec![vec![3.0, 4.0], vec![0.0, 1.0], vec![2.0, 0.0]];
        s.observe(&Feedback {
            round: 0,
            selected: &[0, 1, 2],
            train_losses: &[0.5, 1.0, 2.0],
            updates: Some(&updates),
            durations: Some(&[30.0, 30.0, 30.0]),
            dropped: None,
        });
        let oort = s.oort.save();
        let reward: Vec<f64> = serde_json::from_value(oort["reward"].clone()).unwrap();
        assert_eq!(reward[..3], [50.0, 180.0, 200.0]);
        assert!((reward[3] - 430.0 / 3.0).abs() < 1e-12, "{}", reward[3]);
        let duration: Vec<f64> = serde_json::from_value(oort["duration"].clone()).unwrap();
        assert_eq!(duration, [4.0, 6.0, 10.0, 22.0]);
        assert_eq!(oort["stamp"], serde_json::json!([2, 2, 2, 2]));
        assert_eq!(oort["count"], serde_json::json!([1, 1, 1, 1]));
        assert!((s.gradient[1] - 1.8).abs() < 1e-12);
        assert!(
            (s.gradient[3] - 8.8 / 3.0).abs() < 1e-12,
            "{}",
            s.gradient[3]
        );
        assert!(s.pruned.is_empty());
    }

    /// `code` exploits ⌊K(1 − ε)⌋: after the first round, ε = 0.9·0.95 = 0.855, and of
    /// K = 20 the code's `int(20·0.145)` = 2 exploit (fedsel's `oort`, ⌊20·0.855⌋ = 17
    /// exploring, would exploit 3); the 18 others are never-tried clients.
    #[test]
    fn code_exploits_the_floor_of_k_times_one_minus_epsilon() {
        let sizes: Vec<usize> = (0..60).map(|k| 40 + k).collect();
        let mut s = PyramidFl::new(PyramidflConfig {
            overcommit: 1.0,
            enable_dropout: false,
            enable_adapt_local_epoch: false,
            ..PyramidflConfig::default()
        });
        s.setup(&Setup {
            sizes: sizes.clone(),
            ..setup(&[1.0 / 60.0; 60])
        });
        s.register_devices(&vec![devices()[0]; 60]);
        let available: Vec<usize> = (0..60).collect();
        let run = |s: &mut PyramidFl, round: usize| {
            let ctx = RoundContext {
                round,
                available: &available,
                budget: 20,
                clock_s: None,
            };
            let mut rng = stream(3, Purpose::Selection, round as u64, 0);
            let p = s
                .plan(&ctx, &mut FixedLosses(vec![1.0; 60]), &mut rng)
                .unwrap();
            let picked = p.selection.clients;
            s.observe(&Feedback {
                round,
                selected: &picked,
                train_losses: &vec![1.0; picked.len()],
                updates: None,
                durations: None,
                dropped: None,
            });
            picked
        };
        let first = run(&mut s, 0);
        assert_eq!(first.len(), 20);
        let second = run(&mut s, 1);
        let oort = s.oort.save();
        let exploited: Vec<usize> = serde_json::from_value(oort["exploited"].clone()).unwrap();
        assert_eq!(exploited.len(), 2, "{exploited:?}");
        assert!(exploited.iter().all(|k| first.contains(k)));
        let mut distinct = second.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 20);
        assert_eq!(second.iter().filter(|k| !first.contains(k)).count(), 18);
    }

    /// The learner's cap is max(5·⌊n/B⌋, E) steps: a client of 25 examples in batches of
    /// 10 has a loader of 2 full batches, so at most 10 steps (the ⌈n/B⌉ cap would allow
    /// 15); a ratio of 1.9 gives ⌊10·f32(1.9)⌋ = 18 steps, not 19.
    #[test]
    fn code_steps_truncate_the_float32_ratio_and_cap_at_five_full_loaders() {
        let mut s = pyramid(PyramidflConfig::default());
        s.sizes[0] = 25;
        let d = DeviceReport {
            epoch_steps: 3,
            ..devices()[0]
        };
        assert_eq!(s.code_steps(0, &d, 4.0), 10);
        assert_eq!(capped(4.0, &d), 1.5);
        s.sizes[0] = 1000;
        assert_eq!(s.code_steps(0, &d, 1.9), 18);
        assert_eq!((10.0_f64 * 1.9).floor(), 19.0);
        assert_eq!(s.code_steps(0, &d, 1.0), 10);
        assert_eq!(least_multiplier(18, 10), 1.8);
        assert_eq!((7.0 * least_multiplier(20, 7)).floor(), 20.0);
    }

    /// A table that sets one Oort key keeps PyramidFL's defaults for the others (not
    /// FedScale's), and still refuses an unknown key.
    #[test]
    fn a_partial_oort_table_merges_over_pyramidfl_s_defaults() {
        let cfg: PyramidflConfig = toml::from_str("[oort]\ncut_off_util = 0.5\n").unwrap();
        let want = OortConfig {
            cut_off_util: 0.5,
            ..PyramidflConfig::default().oort
        };
        assert_eq!(cfg.oort, want);
        assert_eq!(cfg.oort.exploration_decay, 0.95);
        assert_eq!(cfg.oort.round_threshold, 10.0);
        let cfg: PyramidflConfig = toml::from_str("overcommit = 1.5\n").unwrap();
        assert_eq!(cfg.oort, PyramidflConfig::default().oort);
        let e = toml::from_str::<PyramidflConfig>("[oort]\ncut_of_util = 0.5\n").unwrap_err();
        assert!(e.to_string().contains("cut_of_util"), "{e}");
    }

    #[test]
    fn config_errors_name_their_keys() {
        let bad = |cfg: PyramidflConfig| cfg.validate().unwrap_err().to_string();
        let e = bad(PyramidflConfig {
            overcommit: 0.5,
            ..PyramidflConfig::default()
        });
        assert!(e.contains("selection.pyramidfl.overcommit"), "{e}");
        let e = bad(PyramidflConfig {
            dropout_low: 0.7,
            ..PyramidflConfig::default()
        });
        assert!(e.contains("selection.pyramidfl.dropout_low"), "{e}");
        let e = bad(PyramidflConfig {
            dropout_high: 1.0,
            ..PyramidflConfig::default()
        });
        assert!(e.contains("selection.pyramidfl.dropout_high"), "{e}");
        let mut cfg = PyramidflConfig::default();
        cfg.oort.pacer_step = 0;
        assert!(bad(cfg).contains("selection.pyramidfl.oort.pacer_step"));
    }
}

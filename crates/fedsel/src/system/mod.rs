//! Device heterogeneity on a virtual clock: each client's compute speed and bandwidth
//! (a [`profile`]), and how long a round lasts under a round policy ([`clock`]).
//!
//! fedsel counts rounds; people who deploy a selector count time, and a round lasts as long
//! as the slowest update the server waits for. With `[system]` absent (or `kind = "none"`)
//! there is no clock and every output is what it was before this module existed.

pub mod behave;
pub mod clock;
pub mod fedscale;
pub mod inflight;
mod pickle;
pub mod profile;
pub mod round;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Result};
use crate::system::clock::Clock;
use crate::validate::{check, check_pos};

/// Where the clients' device profiles come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SystemKind {
    /// No clock: rounds only, as before.
    #[default]
    None,
    /// Drawn per client from log-normal laws ([`profile::lognormal`]).
    Lognormal,
    /// Read from a `client,compute_ms_per_sample,bandwidth_kbps` CSV (`path`).
    Csv,
    /// Read from FedScale's pickled `client_device_capacity` (`path`), mapped to clients
    /// as FedScale's aggregator does ([`fedscale`]).
    Fedscale,
}

/// When the server closes a round.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case", deny_unknown_fields)]
pub enum RoundPolicy {
    /// Wait for every selected client.
    #[default]
    WaitAll,
    /// Select ⌈(1 + overcommit)·K⌉ and aggregate the K that finish first (FedScale's
    /// over-commitment, whose default is 0.3).
    Overcommit {
        /// The fraction of K selected on top of it.
        #[serde(default = "default_overcommit")]
        overcommit: f64,
    },
    /// Aggregate only the updates that arrive within `deadline_s` (FedScale's deadline
    /// mode, FedCS).
    Deadline {
        /// Seconds after the broadcast at which the server stops waiting.
        deadline_s: f64,
    },
    /// Buffered asynchronous aggregation (FedBuff, Nguyen et al., AISTATS'22, Alg. 1):
    /// `concurrency` clients train at once, each from the model it pulled; the server
    /// aggregates every `buffer_size` arrivals, each update weighted by 1/√(1 + staleness),
    /// staleness being the server model versions since the client pulled. A round is one
    /// aggregation ([`round::fedbuff_round`]).
    Fedbuff {
        /// C: clients training at once (FedBuff's concurrency). Required: left out (0), the
        /// config is refused with an error that says what to give.
        #[serde(default)]
        concurrency: usize,
        /// K: arrivals per aggregation (FedBuff's buffer size). Required, as `concurrency`.
        #[serde(default)]
        buffer_size: usize,
    },
}

/// Stale updates (`[system.stale]`): under `deadline` or `overcommit`, an update that misses
/// its round's cut is aggregated, when it arrives, in a later round with a staleness
/// weight, as REFL (Abdelmoniem et al., EuroSys'23) does. The knobs are REFL's, under its
/// names and defaults (ahmedcs/REFL `core/argParser.py` lines 15-16, 53-54); the rule is
/// its aggregator's ([`clock::StaleRule`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StaleConfig {
    /// REFL's `stale_update`: how many rounds a late update may wait after the round that
    /// follows its own; negative for no limit. An update trained in round t is folded in
    /// round t + τ only if τ − 1 ≤ `stale_update` (REFL's `stale_rounds` counter is τ − 1
    /// at the fold). 0 is REFL's "off": leave the table out instead.
    pub stale_update: i64,
    /// REFL's `stale_factor`, the staleness weight, by REFL's codes: > 1 divides by it,
    /// 1 keeps the weight (REFL's default), −1 divides by the round's mean τ, −2 by τ
    /// (AdaSGD), −3 multiplies by e^(−τ) (DynSGD), −4 REFL's own rule.
    pub stale_factor: f64,
    /// REFL's `stale_beta` (default 0.35): the share of the boost in rule −4.
    pub stale_beta: f64,
    /// REFL's `scale_coff` (default 10): the boost's scaling coefficient in rule −4.
    pub scale_coff: f64,
}

impl Default for StaleConfig {
    fn default() -> Self {
        Self {
            stale_update: 1,
            stale_factor: 1.0,
            stale_beta: 0.35,
            scale_coff: 10.0,
        }
    }
}

fn default_overcommit() -> f64 {
    0.3
}

/// The `[system]` table.
///
/// The log-normal parameters follow FedScale's `get_completion_time_lognormal`
/// (SymbioticLab/FedScale, its client metadata), where a device's
/// speed factor is LogNormal(μ = 1, σ = `tail_skew`), floored at 10⁻⁴, and multiplies a
/// mean cost per sample. FedScale draws bandwidth from its device file instead; here it is
/// log-normal around `bandwidth_kbps` (fedsel's choice, so that no file is needed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SystemConfig {
    /// The profile source.
    pub kind: SystemKind,
    /// The profile file (`kind = "csv"` or `"fedscale"` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// FedScale's pickled `client_behave_trace`: when each client is online, in virtual
    /// seconds ([`behave`]). A client must be online at a round's start to be available,
    /// and still online when its update arrives for the update to count. It narrows the
    /// round-indexed availability model rather than replacing it, so both can be used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub behave_trace: Option<PathBuf>,
    /// Milliseconds per sample that the speed factor scales: FedScale's
    /// `mean_seconds_per_sample` = 0.005 s.
    pub mean_ms_per_sample: f64,
    /// σ of the log-normal speed factor: FedScale's `tail_skew` = 0.6.
    pub tail_skew: f64,
    /// Median bandwidth (kbit/s) of the log-normal bandwidth law.
    pub bandwidth_kbps: f64,
    /// σ of the log-normal bandwidth law (0: every client at `bandwidth_kbps`).
    pub bandwidth_skew: f64,
    /// Training cost per sample over a profile's inference cost: forward plus a backward
    /// pass of about twice its latency (FedScale's `augmentation_factor` = 3). FedScale's
    /// log-normal mode does not apply it (its 5 ms is the whole step): set 1.0 to match it.
    pub augmentation: f64,
    /// The round policy (`[system.round]`).
    pub round: RoundPolicy,
    /// Stale updates folded into later rounds (`[system.stale]`), `deadline` and
    /// `overcommit` only; absent, a late update is dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale: Option<StaleConfig>,
    /// Virtual seconds a round lasts when it trains nobody (the selector picked no one, or
    /// nobody was available) and nothing else tells the server when to decide again: no
    /// deadline and no behave trace whose next change it can wait for
    /// ([`Clock::idle_s`](clock::Clock::idle_s)). Absent, the median client's registered
    /// round trip (download, its local work, upload): a server polls again after about one
    /// ordinary round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_s: Option<f64>,
}

impl Default for SystemConfig {
    fn default() -> Self {
        Self {
            kind: SystemKind::None,
            path: None,
            behave_trace: None,
            mean_ms_per_sample: 5.0,
            tail_skew: 0.6,
            bandwidth_kbps: 10_000.0,
            bandwidth_skew: 1.0,
            augmentation: 3.0,
            round: RoundPolicy::WaitAll,
            stale: None,
            idle_s: None,
        }
    }
}

impl SystemConfig {
    /// Whether the virtual clock runs.
    pub fn is_on(&self) -> bool {
        self.kind != SystemKind::None
    }

    /// The clock for a model of `num_params` parameters and one client per entry of
    /// `samples` (the samples each processes in a round's training), with the devices of
    /// the profile source (log-normal ones from `data_seed`) and the behave trace if any;
    /// `None` for kind `none`. The files are read here, so that a bad one fails before the
    /// run starts, and so is every client's training time checked for `rounds` rounds
    /// ([`SystemConfig::check_durations`]).
    pub fn clock(
        &self,
        samples: &[u64],
        rounds: usize,
        num_params: usize,
        data_seed: u64,
    ) -> Result<Option<Clock>> {
        let clients = samples.len();
        let profiles = match (self.kind, &self.path) {
            (SystemKind::None, _) => return Ok(None),
            (SystemKind::Lognormal, _) => profile::lognormal(self, clients, data_seed),
            (SystemKind::Csv, Some(path)) => profile::load_csv(path, clients)?,
            (SystemKind::Fedscale, Some(path)) => fedscale::load_devices(path, clients)?,
            (SystemKind::Csv | SystemKind::Fedscale, None) => {
                return Err(ConfigError::invalid("system.path", "this kind needs a path").into());
            }
        };
        let behave = match &self.behave_trace {
            Some(path) => Some(fedscale::load_behave(path, clients)?),
            None => None,
        };
        let mut clock = Clock::new(self, profiles, num_params).with_behave(behave);
        self.check_durations(&clock, samples, rounds)?;
        let idle_s = self.idle_s.unwrap_or_else(|| {
            let mut trips: Vec<f64> = (0..clients)
                .map(|k| clock.finish_s(k, samples[k]))
                .collect();
            trips.sort_by(f64::total_cmp);
            trips.get(clients / 2).copied().unwrap_or(1.0)
        });
        clock.set_idle_s(idle_s);
        Ok(Some(clock))
    }

    /// Rejects devices whose round the clock cannot count: a client whose training of
    /// `samples[k]` samples lasts an infinite or NaN time, or so long that `rounds` of them
    /// overflow the run's clock. Every value may be finite and legal on its own (a
    /// log-normal σ of 1000, a device file's 1e308 ms per sample, an augmentation of
    /// 1e308) while their product is not; the error names the key whose value makes the
    /// time too large. Query stages and behave-trace waits can still overflow later: the
    /// engine checks every round's time as well.
    pub fn check_durations(
        &self,
        clock: &Clock,
        samples: &[u64],
        rounds: usize,
    ) -> std::result::Result<(), ConfigError> {
        for (k, &n) in samples.iter().enumerate() {
            let t = clock.finish_s(k, n);
            if t.is_finite() && (t * rounds.max(1) as f64).is_finite() {
                continue;
            }
            let p = clock.profile(k);
            let transfer_s = clock.transfer_s(k);
            let compute_s = self.augmentation * n as f64 * p.compute_ms_per_sample / 1000.0;
            let (key, value) = if !(transfer_s.is_finite() && transfer_s <= compute_s) {
                self.bandwidth_source(p.bandwidth_kbps)
            } else if self.augmentation >= p.compute_ms_per_sample {
                ("system.augmentation".to_string(), show(self.augmentation))
            } else {
                self.compute_source(p.compute_ms_per_sample)
            };
            return Err(ConfigError::invalid(
                key,
                format!(
                    "{value} makes client {k}'s training last {} virtual seconds a round \
                     ({} ms per sample × augmentation {} × {n} samples, and the model each way \
                     at {} kbit/s): more than the clock can count over {rounds} rounds",
                    show(t),
                    show(p.compute_ms_per_sample),
                    show(self.augmentation),
                    show(p.bandwidth_kbps)
                ),
            ));
        }
        Ok(())
    }

    /// The key (and what it holds) that set a device's compute time of `ms` per sample.
    fn compute_source(&self, ms: f64) -> (String, String) {
        match self.kind {
            SystemKind::Lognormal if self.mean_ms_per_sample >= ms / self.mean_ms_per_sample => (
                "system.mean_ms_per_sample".into(),
                show(self.mean_ms_per_sample),
            ),
            SystemKind::Lognormal => (
                "system.tail_skew".into(),
                format!(
                    "{} (a device drawn at {} ms per sample)",
                    self.tail_skew,
                    show(ms)
                ),
            ),
            _ => self.file_source("computation", ms),
        }
    }

    /// The key (and what it holds) that set a device's bandwidth of `kbps`.
    fn bandwidth_source(&self, kbps: f64) -> (String, String) {
        match self.kind {
            SystemKind::Lognormal if kbps >= self.bandwidth_kbps => {
                ("system.bandwidth_kbps".into(), show(self.bandwidth_kbps))
            }
            SystemKind::Lognormal => (
                "system.bandwidth_skew".into(),
                format!(
                    "{} (a device drawn at {} kbit/s)",
                    self.bandwidth_skew,
                    show(kbps)
                ),
            ),
            _ => self.file_source("communication", kbps),
        }
    }

    fn file_source(&self, field: &str, value: f64) -> (String, String) {
        let path = self.path.as_deref().map(|p| p.display().to_string());
        (
            "system.path".into(),
            format!("`{}` ({field} = {})", path.unwrap_or_default(), show(value)),
        )
    }

    /// The devices and the round policy in a few words, for a run's first console line;
    /// `None` without a clock.
    pub fn describe(&self) -> Option<String> {
        let file = |p: &Option<PathBuf>| {
            p.as_deref()
                .map_or(String::new(), |p| p.display().to_string())
        };
        let devices = match self.kind {
            SystemKind::None => return None,
            SystemKind::Lognormal => format!(
                "log-normal devices ({} ms/sample × LogNormal(1, {}), {} kbit/s × LogNormal(0, {}))",
                self.mean_ms_per_sample, self.tail_skew, self.bandwidth_kbps, self.bandwidth_skew
            ),
            SystemKind::Csv => format!("devices from `{}`", file(&self.path)),
            SystemKind::Fedscale => format!("FedScale devices from `{}`", file(&self.path)),
        };
        let policy = match self.round {
            RoundPolicy::WaitAll => "wait for all".to_string(),
            RoundPolicy::Overcommit { overcommit } => format!("over-commit {overcommit}"),
            RoundPolicy::Deadline { deadline_s } => format!("deadline {deadline_s} s"),
            RoundPolicy::Fedbuff {
                concurrency,
                buffer_size,
            } => format!("FedBuff (concurrency {concurrency}, buffer {buffer_size})"),
        };
        let policy = match &self.stale {
            Some(s) => format!(
                "{policy}, stale updates (stale_update {}, stale_factor {})",
                s.stale_update, s.stale_factor
            ),
            None => policy,
        };
        let trace = match &self.behave_trace {
            Some(p) => format!(", online per `{}`", p.display()),
            None => String::new(),
        };
        Some(format!(
            "clock: {devices}, augmentation {}, {policy}{trace}",
            self.augmentation
        ))
    }

    /// Rejects values no run can use, naming the key: this table's part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> std::result::Result<(), ConfigError> {
        check(
            self.is_on() || self.round == RoundPolicy::WaitAll,
            "system.kind",
            "is `none`, so there is no clock for system.round to act on: choose `lognormal`, `csv` or `fedscale`",
        )?;
        if let (false, Some(p)) = (self.is_on(), &self.behave_trace) {
            return Err(ConfigError::invalid(
                "system.behave_trace",
                format!(
                    "`{}` needs a clock, and system.kind is `none`: choose `lognormal`, `csv` or `fedscale`",
                    p.display()
                ),
            ));
        }
        match (self.kind, &self.path) {
            (SystemKind::Csv, None) => {
                return Err(ConfigError::invalid(
                    "system.path",
                    "kind = \"csv\" needs the path of a `client,compute_ms_per_sample,bandwidth_kbps` file",
                ));
            }
            (SystemKind::Fedscale, None) => {
                return Err(ConfigError::invalid(
                    "system.path",
                    "kind = \"fedscale\" needs the path of FedScale's pickled `client_device_capacity`",
                ));
            }
            (SystemKind::None | SystemKind::Lognormal, Some(p)) => {
                return Err(ConfigError::invalid(
                    "system.path",
                    format!(
                        "`{}` is read only by kind = \"csv\" or \"fedscale\"",
                        p.display()
                    ),
                ));
            }
            _ => {}
        }
        check_pos(self.mean_ms_per_sample, "system.mean_ms_per_sample")?;
        check(
            self.tail_skew.is_finite() && self.tail_skew >= 0.0,
            "system.tail_skew",
            format!("{} must be finite and ≥ 0", self.tail_skew),
        )?;
        check_pos(self.bandwidth_kbps, "system.bandwidth_kbps")?;
        check(
            self.bandwidth_skew.is_finite() && self.bandwidth_skew >= 0.0,
            "system.bandwidth_skew",
            format!("{} must be finite and ≥ 0", self.bandwidth_skew),
        )?;
        check_pos(self.augmentation, "system.augmentation")?;
        if let Some(idle) = self.idle_s {
            check(
                self.is_on(),
                "system.idle_s",
                "needs a clock, and system.kind is `none`",
            )?;
            check_pos(idle, "system.idle_s")?;
        }
        if let Some(st) = &self.stale {
            check(
                matches!(
                    self.round,
                    RoundPolicy::Deadline { .. } | RoundPolicy::Overcommit { .. }
                ),
                "system.stale",
                "needs system.round.policy = \"deadline\" or \"overcommit\": only they leave updates late",
            )?;
            check(
                st.stale_update != 0,
                "system.stale.stale_update",
                "0 is REFL's \"no stale updates\": leave [system.stale] out instead",
            )?;
            check(
                st.stale_factor.is_finite()
                    && (st.stale_factor >= 1.0
                        || [-1.0, -2.0, -3.0, -4.0].contains(&st.stale_factor)),
                "system.stale.stale_factor",
                format!(
                    "{} is none of REFL's codes: > 1 (divide), 1 (equal), -1 (mean), -2 (AdaSGD), -3 (DynSGD), -4 (REFL)",
                    st.stale_factor
                ),
            )?;
            check(
                (0.0..=1.0).contains(&st.stale_beta),
                "system.stale.stale_beta",
                format!("{} must be in [0, 1]", st.stale_beta),
            )?;
            check_pos(st.scale_coff, "system.stale.scale_coff")?;
        }
        match self.round {
            RoundPolicy::WaitAll => Ok(()),
            RoundPolicy::Overcommit { overcommit } => check(
                overcommit.is_finite() && overcommit >= 0.0,
                "system.round.overcommit",
                format!("{overcommit} must be finite and ≥ 0"),
            ),
            RoundPolicy::Deadline { deadline_s } => {
                check_pos(deadline_s, "system.round.deadline_s")
            }
            RoundPolicy::Fedbuff {
                concurrency,
                buffer_size,
            } => {
                for (key, v) in [("concurrency", concurrency), ("buffer_size", buffer_size)] {
                    check(
                        v >= 1,
                        &format!("system.round.{key}"),
                        "policy = \"fedbuff\" needs both of its sizes, which have no default: concurrency (C, the clients training at once) and buffer_size (K, the arrivals aggregated at once), with C ≥ K ≥ 1; FedBuff (Nguyen et al., AISTATS'22) runs K well below C, e.g. system.round = { policy = \"fedbuff\", concurrency = 20, buffer_size = 10 }",
                    )?;
                }
                check(
                    concurrency >= buffer_size,
                    "system.round.concurrency",
                    format!(
                        "{concurrency} clients in flight can never fill a buffer of {buffer_size}: concurrency must be ≥ buffer_size"
                    ),
                )
            }
        }
    }
}

/// A number as people write it: plain in the usual range, in exponent form (`1e308`)
/// beyond it, where Rust's plain form would print 309 digits.
fn show(x: f64) -> String {
    if x != 0.0 && x.is_finite() && !(1e-4..1e6).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, RoundPolicy, SystemKind};

    fn load(set: &[&str]) -> Result<Config, String> {
        let set: Vec<String> = set.iter().map(|s| s.to_string()).collect();
        let c = Config::load(None, &set).map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn the_system_table_parses_and_bad_values_name_their_key() {
        let c = load(&[
            "system.kind=\"lognormal\"",
            "system.round={policy=\"deadline\", deadline_s=2.5}",
        ])
        .unwrap();
        let s = c.system.unwrap();
        assert_eq!(s.kind, SystemKind::Lognormal);
        let c = load(&[
            "system.kind=\"fedscale\"",
            "system.path=\"client_device_capacity\"",
            "system.behave_trace=\"client_behave_trace\"",
        ])
        .unwrap()
        .system
        .unwrap();
        assert_eq!(c.kind, SystemKind::Fedscale);
        assert_eq!(c.behave_trace, Some("client_behave_trace".into()));
        assert_eq!(s.round, RoundPolicy::Deadline { deadline_s: 2.5 });
        let c = load(&[
            "system.kind=\"lognormal\"",
            "system.round.policy=\"overcommit\"",
        ]);
        assert_eq!(
            c.unwrap().system.unwrap().round,
            RoundPolicy::Overcommit { overcommit: 0.3 }
        );
        for (set, key) in [
            (&["system.kind=\"csv\""][..], "system.path"),
            (&["system.kind=\"fedscale\""], "system.path"),
            (&["system.behave_trace=\"t.pkl\""], "system.behave_trace"),
            (
                &["system.kind=\"lognormal\"", "system.path=\"d.csv\""],
                "system.path",
            ),
            (&["system.round.policy=\"overcommit\""], "system.kind"),
            (
                &["system.kind=\"lognormal\"", "system.augmentation=0"],
                "system.augmentation",
            ),
            (
                &["system.kind=\"lognormal\"", "system.tail_skew=-1"],
                "system.tail_skew",
            ),
            (
                &[
                    "system.kind=\"lognormal\"",
                    "system.round={policy=\"overcommit\", overcommit=-0.5}",
                ],
                "system.round.overcommit",
            ),
            (
                &[
                    "system.kind=\"lognormal\"",
                    "system.round={policy=\"deadline\", deadline_s=0}",
                ],
                "system.round.deadline_s",
            ),
            (&["system.kind=\"lognormal\"", "system.speed=1"], "speed"),
        ] {
            let e = load(set).unwrap_err();
            assert!(e.contains(key), "{set:?}: {e}");
        }
    }

    #[test]
    fn an_absent_system_table_leaves_the_resolved_config_and_hash_alone() {
        let plain = Config::default();
        assert!(!plain.to_resolved_toml().contains("system"));
        let on = load(&["system.kind=\"lognormal\""]).unwrap();
        assert!(on.to_resolved_toml().contains("[system.round]"));
        assert_ne!(on.hash(), plain.hash());
        let back = Config::from_toml_str(&on.to_resolved_toml(), "resolved", &[]);
        assert_eq!(back.unwrap().system, on.system);
    }
}

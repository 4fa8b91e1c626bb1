//! Device heterogeneity on a virtual clock: each client's compute speed and bandwidth
//! (a [`profile`]), and how long a round lasts under a round policy ([`clock`]).
//!
//! fedsel counts rounds; people who deploy a selector count time, and a round lasts as long
//! as the slowest update the server waits for. With `[system]` absent (or `kind = "none"`)
//! there is no clock and every output is what it was before this module existed.

pub mod behave;
pub mod clock;
pub mod fedscale;
pub mod profile;

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
        }
    }
}

impl SystemConfig {
    /// Whether the virtual clock runs.
    pub fn is_on(&self) -> bool {
        self.kind != SystemKind::None
    }

    /// The clock for `clients` clients and a model of `num_params` parameters, with the
    /// devices of the profile source (log-normal ones from `data_seed`) and the behave
    /// trace if any; `None` for kind `none`. The files are read here, so that a bad one
    /// fails before the run starts.
    pub fn clock(
        &self,
        clients: usize,
        num_params: usize,
        data_seed: u64,
    ) -> Result<Option<Clock>> {
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
        Ok(Some(
            Clock::new(self, profiles, num_params).with_behave(behave),
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
        }
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

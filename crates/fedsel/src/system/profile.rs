//! Each client's device: how fast it computes and how fast it transfers.

use std::path::Path;

use rand_distr::{Distribution, LogNormal};

use crate::error::{DataError, Result, csv_with_header, read_file};
use crate::rng::{Purpose, stream};
use crate::system::SystemConfig;

/// One client's device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    /// Inference latency per sample, in milliseconds (FedScale's `computation`).
    pub compute_ms_per_sample: f64,
    /// Bandwidth in kbit/s, both ways (FedScale's `communication`).
    pub bandwidth_kbps: f64,
}

/// FedScale's floor on the log-normal speed factor, which keeps a device from being
/// infinitely fast.
const MIN_SPEED: f64 = 1e-4;

/// Draws every client's device from the data seed's own stream (one per client, speed
/// then bandwidth), so that every strategy run on a seed meets the same devices, and
/// adding clients leaves the first ones' devices as they were.
pub fn lognormal(cfg: &SystemConfig, clients: usize, data_seed: u64) -> Vec<Profile> {
    let speed = LogNormal::new(1.0, cfg.tail_skew).expect("validated: tail_skew ≥ 0");
    let bandwidth = LogNormal::new(cfg.bandwidth_kbps.ln(), cfg.bandwidth_skew)
        .expect("validated: bandwidth_kbps > 0, bandwidth_skew ≥ 0");
    (0..clients)
        .map(|k| {
            let mut rng = stream(data_seed, Purpose::Device, 0, k as u64);
            let factor = speed.sample(&mut rng).max(MIN_SPEED);
            Profile {
                compute_ms_per_sample: cfg.mean_ms_per_sample * factor,
                bandwidth_kbps: bandwidth.sample(&mut rng),
            }
        })
        .collect()
}

/// Reads a `client,compute_ms_per_sample,bandwidth_kbps` file for `clients` clients.
pub fn load_csv(path: &Path, clients: usize) -> Result<Vec<Profile>> {
    parse_csv(path, &read_file(path)?, clients)
}

/// Parses and checks profile CSV bytes: every client of the partition exactly once, each
/// value finite and > 0. Errors name the file (`path`), the line and the client.
pub fn parse_csv(path: &Path, bytes: &[u8], clients: usize) -> Result<Vec<Profile>> {
    let bad = |reason: String| DataError::corrupt(path, reason);
    let want = ["client", "compute_ms_per_sample", "bandwidth_kbps"];
    let mut reader = csv_with_header(path, bytes, &want)?;
    let mut profiles: Vec<Option<Profile>> = vec![None; clients];
    for (i, row) in reader.records().enumerate() {
        let line = i + 2;
        let row = row.map_err(|e| bad(format!("line {line}: {e}")))?;
        let k: usize = row
            .get(0)
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| {
                bad(format!(
                    "line {line}: `client` is not a non-negative integer"
                ))
            })?;
        if k >= clients {
            return Err(bad(format!(
                "line {line}: client {k} does not exist (the partition has {clients} clients)"
            ))
            .into());
        }
        let value = |j: usize, name: &str| -> std::result::Result<f64, DataError> {
            let raw = row.get(j).unwrap_or("").trim();
            raw.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| {
                    bad(format!(
                        "line {line}: client {k}'s `{name}` is `{raw}`, not a finite number > 0"
                    ))
                })
        };
        let profile = Profile {
            compute_ms_per_sample: value(1, want[1])?,
            bandwidth_kbps: value(2, want[2])?,
        };
        if profiles[k].replace(profile).is_some() {
            return Err(bad(format!("line {line}: client {k} is listed twice")).into());
        }
    }
    profiles
        .into_iter()
        .enumerate()
        .map(|(k, p)| p.ok_or_else(|| bad(format!("client {k} has no row")).into()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, clients: usize) -> std::result::Result<Vec<Profile>, String> {
        parse_csv(Path::new("devices.csv"), text.as_bytes(), clients).map_err(|e| e.to_string())
    }

    #[test]
    fn a_well_formed_file_gives_each_client_its_row() {
        let p = parse(
            "client,compute_ms_per_sample,bandwidth_kbps\n1,2.5,800\n0,10,1000\n",
            2,
        )
        .unwrap();
        assert_eq!(
            p,
            [
                Profile {
                    compute_ms_per_sample: 10.0,
                    bandwidth_kbps: 1000.0
                },
                Profile {
                    compute_ms_per_sample: 2.5,
                    bandwidth_kbps: 800.0
                },
            ]
        );
    }

    #[test]
    fn a_malformed_file_is_an_error_naming_file_line_and_client() {
        let head = "client,compute_ms_per_sample,bandwidth_kbps\n";
        let cases = [
            (
                format!("{head}0,1,1\n1,abc,1\n"),
                "line 3: client 1's `compute_ms_per_sample` is `abc`",
            ),
            (
                format!("{head}0,1,0\n1,1,1\n"),
                "line 2: client 0's `bandwidth_kbps` is `0`",
            ),
            (
                format!("{head}0,1,1\n0,1,1\n"),
                "line 3: client 0 is listed twice",
            ),
            (
                format!("{head}0,1,1\n2,1,1\n"),
                "line 3: client 2 does not exist",
            ),
            (format!("{head}0,1,1\n"), "client 1 has no row"),
            ("client,speed\n0,1\n".to_string(), "the header must be"),
        ];
        for (text, want) in cases {
            let e = parse(&text, 2).unwrap_err();
            assert!(e.contains("devices.csv"), "{e}");
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }

    #[test]
    fn lognormal_devices_depend_on_the_data_seed_only_and_follow_the_law() {
        let cfg = SystemConfig::default();
        let a = lognormal(&cfg, 2000, 7);
        assert_eq!(a, lognormal(&cfg, 2000, 7));
        assert_eq!(a[..10], lognormal(&cfg, 10, 7)[..]);
        assert_ne!(a, lognormal(&cfg, 2000, 8));
        // Medians: 5 ms · e¹ for the speed, 10 000 kbit/s for the bandwidth, within a
        // few percent over 2000 draws.
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let c = median(a.iter().map(|p| p.compute_ms_per_sample).collect());
        let b = median(a.iter().map(|p| p.bandwidth_kbps).collect());
        assert!((c / (5.0 * std::f64::consts::E) - 1.0).abs() < 0.05, "{c}");
        assert!((b / 10_000.0 - 1.0).abs() < 0.1, "{b}");
    }
}

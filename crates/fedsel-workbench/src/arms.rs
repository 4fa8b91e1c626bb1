//! Plain run directories grouped into arms, for `fedsel report RUN_DIR...`.
//!
//! A sweep knows its arms from its grid; loose runs do not, so they are read from the
//! resolved configs: runs whose configs are equal once the keys of [`IGNORED`] are set
//! aside are seeds of one arm, and an arm is named by the keys in which the arms differ.
//! Runs made by hand (`fedsel run --set ...`) can then be compared with the same tables
//! and statistics as a sweep.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fedsel::error::{ConfigError, Error, Result};

/// Keys that do not make runs different experiments: the seed (the arm's replicate), the
/// run's name, where its data lives, how often it checkpoints and the version stamp. The
/// data seed is set aside only where it is the run's seed (unpinned); a pinned one counts.
pub const IGNORED: [&str; 6] = [
    "seed",
    "data_seed",
    "name",
    "data_dir",
    "checkpoint_every",
    "fedsel_version",
];

/// The strategy key, which names an arm by its value alone.
const STRATEGY: &str = "selection.strategy";

/// Runs of one configuration over seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct Arm {
    /// The keys in which it differs from the other arms, as `key=value` (the strategy by
    /// its name alone); the strategy where there is one arm.
    pub label: String,
    /// Its run directories, in the order given.
    pub dirs: Vec<PathBuf>,
}

fn invalid(dir: &Path, why: impl Into<String>) -> Error {
    Error::Output {
        path: dir.to_path_buf(),
        error: std::io::Error::new(std::io::ErrorKind::InvalidData, why.into()),
    }
}

/// Every leaf of a TOML table under its dotted key; strings without their quotes. A round
/// policy (`system.round`, a table tagged by `policy`) is one leaf named as a sweep names it
/// (`system.round=overcommit-0.3`): its parameters mean nothing apart from the policy.
fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    match value {
        toml::Value::Table(t) if !prefix.is_empty() && t.contains_key("policy") => {
            out.insert(prefix.to_string(), crate::sweep::value_label(value));
        }
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = match prefix {
                    "" => k.clone(),
                    p => format!("{p}.{k}"),
                };
                flatten(&key, v, out);
            }
        }
        toml::Value::String(s) => {
            out.insert(prefix.to_string(), s.clone());
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

/// A finished run's resolved config, flattened, without the keys of [`IGNORED`], and its seed.
fn read_config(dir: &Path) -> Result<(BTreeMap<String, String>, String)> {
    if dir.join("sweep.json").is_file() {
        return Err(invalid(
            dir,
            "is a sweep directory: report it alone (`fedsel report SWEEP_DIR`), or name its cells' run directories",
        ));
    }
    let path = dir.join("config.resolved.toml");
    if !path.is_file() || !dir.join("summary.json").is_file() {
        return Err(invalid(
            dir,
            "not a sweep directory (it has no sweep.json) and not a run directory (it has no config.resolved.toml and summary.json): `fedsel report` takes one sweep directory or run directories",
        ));
    }
    let summary: serde_json::Value = std::fs::read_to_string(dir.join("summary.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .ok_or_else(|| invalid(&dir.join("summary.json"), "is not valid JSON"))?;
    if summary["status"] != "finished" {
        return Err(invalid(
            dir,
            format!(
                "not a finished run (summary.json has status {}): finish it with `fedsel run --resume`",
                summary["status"]
            ),
        ));
    }
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Output {
        path: path.clone(),
        error: source,
    })?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| invalid(&path, e.to_string()))?;
    let mut flat = BTreeMap::new();
    flatten("", &toml::Value::Table(table), &mut flat);
    let seed = flat.get("seed").cloned().unwrap_or_default();
    if flat.get("data_seed") == Some(&seed) {
        flat.remove("data_seed");
    }
    for key in IGNORED.iter().filter(|k| **k != "data_seed") {
        flat.remove(*key);
    }
    Ok((flat, seed))
}

/// Groups run directories into arms, in the order of their first run. Two runs of one arm
/// with one seed (a directory named twice, a copy) are refused: seeds pair runs across arms.
pub fn arms(dirs: &[PathBuf]) -> Result<Vec<Arm>> {
    let mut configs: Vec<BTreeMap<String, String>> = Vec::new();
    let mut members: Vec<Vec<(PathBuf, String)>> = Vec::new();
    for dir in dirs {
        let (config, seed) = read_config(dir)?;
        let i = configs
            .iter()
            .position(|c| *c == config)
            .unwrap_or_else(|| {
                configs.push(config);
                members.push(Vec::new());
                configs.len() - 1
            });
        if let Some((twin, _)) = members[i].iter().find(|(_, s)| *s == seed) {
            return Err(ConfigError::invalid(
                "DIR",
                format!(
                    "`{}` and `{}` are runs of one configuration with one seed ({seed}): name each run once",
                    twin.display(),
                    dir.display()
                ),
            )
            .into());
        }
        members[i].push((dir.clone(), seed));
    }
    let keys: std::collections::BTreeSet<&String> = configs.iter().flat_map(|c| c.keys()).collect();
    let mut differing: Vec<&String> = keys
        .into_iter()
        .filter(|k| configs.iter().any(|c| c.get(*k) != configs[0].get(*k)))
        .collect();
    differing.sort_by_key(|k| *k != STRATEGY);
    Ok(configs
        .iter()
        .zip(members)
        .map(|(config, members)| {
            let value = |k: &str| config.get(k).map_or("-", String::as_str).to_string();
            let label = match differing.is_empty() {
                true => value(STRATEGY),
                false => differing
                    .iter()
                    .map(|k| match k.as_str() {
                        STRATEGY => value(k),
                        _ => format!("{k}={}", value(k)),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            Arm {
                label,
                dirs: members.into_iter().map(|m| m.0).collect(),
            }
        })
        .collect())
}

/// Refuses an output directory that is one of the runs compared, or any run's or sweep's
/// own directory: a comparison writes `report.md`, its CSVs and `plots/`, which must never
/// land among a run's results.
pub fn check_out(out: &Path, dirs: &[PathBuf]) -> Result<()> {
    let same = |d: &PathBuf| match (out.canonicalize(), d.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    let holds_run = ["config.resolved.toml", "summary.json", "sweep.json"]
        .iter()
        .any(|f| out.join(f).exists());
    if dirs.iter().any(same) || holds_run {
        return Err(ConfigError::invalid(
            "--out",
            format!(
                "`{}` is a run's or a sweep's directory; a comparison of runs goes into a directory of its own",
                out.display()
            ),
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(root: &Path, name: &str, config: &str) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.resolved.toml"), config).unwrap();
        std::fs::write(dir.join("summary.json"), r#"{"status": "finished"}"#).unwrap();
        dir
    }

    /// Seeds (and an unpinned data seed, a name, a checkpoint interval) do not split an
    /// arm; the strategy and the learning rate do, and label the arms; a pinned data seed
    /// that differs is a difference.
    #[test]
    fn runs_group_by_config_without_seed_and_are_named_by_what_differs() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = |seed: u64, strategy: &str, lr: f64, extra: &str| {
            format!(
                "name = \"r{seed}\"\nseed = {seed}\ndata_seed = {seed}\ncheckpoint_every = {seed}\n{extra}[selection]\nstrategy = \"{strategy}\"\n[train]\nlr = {lr}\n"
            )
        };
        let dirs = [
            run(tmp.path(), "a", &cfg(1, "uniform", 0.1, "")),
            run(tmp.path(), "b", &cfg(1, "powd", 0.1, "")),
            run(tmp.path(), "c", &cfg(2, "uniform", 0.1, "")),
            run(tmp.path(), "d", &cfg(1, "powd", 0.05, "")),
        ];
        let arms = arms(&dirs).unwrap();
        let labels: Vec<&str> = arms.iter().map(|a| a.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "uniform, train.lr=0.1",
                "powd, train.lr=0.1",
                "powd, train.lr=0.05"
            ]
        );
        assert_eq!(arms[0].dirs, [dirs[0].clone(), dirs[2].clone()]);
        let one = super::arms(&dirs[..1]).unwrap();
        assert_eq!(one[0].label, "uniform");
        let pinned = run(
            tmp.path(),
            "e",
            &cfg(3, "uniform", 0.1, "").replace("data_seed = 3", "data_seed = 1"),
        );
        let two = super::arms(&[dirs[0].clone(), pinned]).unwrap();
        assert_eq!(two[1].label, "data_seed=1");
        assert_eq!(two[0].label, "data_seed=-");
        // Round policies differ as wholes: one key, named by policy and parameter.
        let policy = |name: &str, round: &str| {
            let extra = format!("[system]\nkind = \"lognormal\"\n[system.round]\n{round}\n");
            run(tmp.path(), name, &cfg(1, "uniform", 0.1, &extra))
        };
        let rounds = super::arms(&[
            policy("f", "policy = \"overcommit\"\novercommit = 0.3"),
            policy("g", "policy = \"deadline\"\ndeadline_s = 30.0"),
        ])
        .unwrap();
        let labels: Vec<&str> = rounds.iter().map(|a| a.label.as_str()).collect();
        assert_eq!(
            labels,
            ["system.round=overcommit-0.3", "system.round=deadline-30.0s"]
        );
    }

    /// A directory named twice, a directory that is no run, an unfinished run and an output
    /// directory inside the compared runs are refused, each naming what is wrong.
    #[test]
    fn mistakes_name_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let a = run(tmp.path(), "a", "seed = 1\n");
        let err = arms(&[a.clone(), a.clone()]).unwrap_err().to_string();
        assert!(err.contains("one seed (1)") && err.contains("/a`"), "{err}");
        let err = arms(&[tmp.path().to_path_buf()]).unwrap_err().to_string();
        assert!(err.contains("not a run directory"), "{err}");
        std::fs::write(a.join("summary.json"), r#"{"status": "failed"}"#).unwrap();
        let err = arms(std::slice::from_ref(&a)).unwrap_err().to_string();
        assert!(
            err.contains("not a finished run") && err.contains("failed"),
            "{err}"
        );
        let err = check_out(&a, std::slice::from_ref(&a))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--out"), "{err}");
        check_out(&tmp.path().join("cmp"), &[a]).unwrap();
    }
}

//! Plain run directories grouped into arms, for `fedsel report RUN_DIR...`.
//!
//! A sweep knows its arms from its grid; loose runs do not, so they are read from the
//! resolved configs: runs whose configs are equal once the keys of [`IGNORED`] are set
//! aside are seeds of one arm, and an arm is named by the keys in which the arms differ.
//! Runs made by hand (`fedsel run --set ...`) can then be compared with the same tables
//! and statistics as a sweep.
//!
//! Only what can be compared is: arms of different tasks ([`TASK`]: another dataset,
//! partition, model or targets) are refused unless the caller allows it, since pairing their
//! seeds or putting their targets in one column would mean nothing; and a run that is not
//! whole (no `summary.json`, a `metrics.csv` cut short) is left out and named, since its
//! curve would stop early and its summary may not match its rounds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use fedsel::error::ConfigError;

use crate::error::{Difference, Error, LeftOut, Result};

/// Keys that do not make runs different experiments: the seed (the arm's replicate), the
/// run's name, where its data lives, how often it checkpoints, the version stamp and where
/// its TensorBoard events go (each cell of a sweep has its own directory). The data seed
/// is set aside only where it is the run's seed (unpinned); a pinned one counts.
pub const IGNORED: [&str; 7] = [
    "seed",
    "data_seed",
    "name",
    "data_dir",
    "checkpoint_every",
    "fedsel_version",
    "output.tensorboard",
];

/// The keys that make the task a run learns, each with every key under it: the data, its
/// split over clients (the number of clients included), the model's architecture and the
/// target accuracies. Arms that differ here are not two methods on one problem.
pub const TASK: [&str; 4] = ["dataset", "partition", "model.kind", "targets"];

/// The strategy key, which comes first in an arm's name.
const STRATEGY: &str = "selection.strategy";

/// Runs of one configuration over seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct Arm {
    /// The keys in which it differs from the other arms, as `key=value` with each key
    /// shortened to the end that no other key shares (`strategy=oort`, `lr=0.1`), the
    /// strategy first; `strategy=NAME` where there is one arm.
    pub label: String,
    /// Its run directories, in the order given.
    pub dirs: Vec<PathBuf>,
}

/// Run directories grouped into arms, with what was left out.
#[derive(Debug, Clone, PartialEq)]
pub struct Arms {
    /// The arms, in the order of their first run.
    pub arms: Vec<Arm>,
    /// The runs left out (not whole), in the order given, and why.
    pub left_out: Vec<LeftOut>,
    /// The task keys in which the arms differ, where the caller allowed it; empty otherwise.
    pub mixed: Vec<Difference>,
}

fn invalid(dir: &Path, why: impl Into<String>) -> fedsel::error::Error {
    fedsel::error::Error::Output {
        path: dir.to_path_buf(),
        error: std::io::Error::new(std::io::ErrorKind::InvalidData, why.into()),
    }
}

/// Every leaf of a TOML table under its dotted key; strings without their quotes. A round
/// policy (`system.round`, a table tagged by `policy`) is one leaf, since its parameters mean
/// nothing apart from the policy: named as a sweep names it (`system.round=overcommit-0.3`)
/// when it has one parameter, and with each parameter's name when it has several
/// (`system.round=fedbuff concurrency=10 buffer_size=6`), whose bare numbers would not say
/// which is which.
fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    match value {
        toml::Value::Table(t) if !prefix.is_empty() && t.contains_key("policy") => {
            let label = if t.len() > 2 {
                std::iter::once(crate::sweep::value_label(&t["policy"]))
                    .chain(
                        t.iter()
                            .filter(|(k, _)| *k != "policy")
                            .map(|(k, v)| format!("{k}={}", crate::sweep::value_label(v))),
                    )
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                crate::sweep::value_label(value)
            };
            out.insert(prefix.to_string(), label);
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

fn read_summary(dir: &Path) -> fedsel::error::Result<serde_json::Value> {
    std::fs::read_to_string(dir.join("summary.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .ok_or_else(|| invalid(&dir.join("summary.json"), "is not valid JSON"))
}

/// Why a finished run is not whole, or `None` when it is: no `summary.json` (the run stopped
/// before writing it), or a `metrics.csv` that is missing, damaged, holds fewer rows than the
/// summary's rounds or does not end at the summary's last round (a copy cut short). A
/// summary without a number of rounds is an error: no run writes one.
pub fn truncation(dir: &Path) -> fedsel::error::Result<Option<String>> {
    if !dir.join("summary.json").is_file() {
        return Ok(Some(
            "truncated: it has no summary.json (the run stopped before it finished)".into(),
        ));
    }
    let summary = read_summary(dir)?;
    if let Some(status @ ("failed" | "interrupted")) = summary["status"].as_str() {
        let done = summary["rounds_completed"].as_u64().unwrap_or(0);
        let next = if fedsel::checkpoint::load(dir).is_ok() {
            format!(
                "`fedsel run --resume {}` continues it from its last checkpoint",
                dir.display()
            )
        } else {
            "it has no checkpoint to resume from".into()
        };
        return Ok(Some(format!(
            "{status} after {done} rounds ({}); {next}",
            summary["error"].as_str().unwrap_or("no error recorded")
        )));
    }
    let rounds = summary["rounds"]
        .as_u64()
        .ok_or_else(|| invalid(&dir.join("summary.json"), "has no number of rounds"))?;
    let path = dir.join("metrics.csv");
    let mut reader = match csv::Reader::from_path(&path) {
        Ok(r) => r,
        Err(e) => return Ok(Some(format!("truncated: metrics.csv cannot be read ({e})"))),
    };
    let round = reader
        .headers()
        .ok()
        .and_then(|h| h.iter().position(|c| c == "round"));
    let Some(round) = round else {
        return Ok(Some("damaged: metrics.csv has no round column".into()));
    };
    let (mut rows, mut last) = (0u64, None);
    for row in reader.records() {
        let row = match row {
            Ok(row) => row,
            Err(e) => {
                return Ok(Some(format!(
                    "truncated: metrics.csv breaks off after {rows} rows ({e})"
                )));
            }
        };
        rows += 1;
        last = row.get(round).and_then(|r| r.parse::<u64>().ok());
    }
    // `metrics.csv` counts rounds from 0; the summary counts them.
    Ok(if rows < rounds {
        Some(format!(
            "truncated: metrics.csv holds {rows} of the {rounds} rounds in summary.json"
        ))
    } else if rounds > 0 && last != Some(rounds - 1) {
        Some(format!(
            "truncated: metrics.csv ends at round {}, summary.json at round {rounds}",
            last.map_or("?".into(), |l| (l + 1).to_string())
        ))
    } else {
        None
    })
}

/// What a run directory brings to a comparison.
enum Read {
    /// A whole finished run: its resolved config, flattened, without the keys of
    /// [`IGNORED`], and its seed.
    Run(BTreeMap<String, String>, String),
    /// A run left out, and why.
    LeftOut(String),
}

fn read_config(dir: &Path) -> Result<Read> {
    if dir.join("sweep.json").is_file() {
        return Err(invalid(
            dir,
            "is a sweep directory: report it alone (`fedsel report SWEEP_DIR`), or name its cells' run directories",
        )
        .into());
    }
    let path = dir.join("config.resolved.toml");
    if !path.is_file() {
        return Err(invalid(
            dir,
            "not a sweep directory (it has no sweep.json) and not a run directory (it has no config.resolved.toml): `fedsel report` takes one sweep directory or run directories",
        )
        .into());
    }
    if dir.join("summary.json").is_file() {
        let summary = read_summary(dir)?;
        // A failed or interrupted run is left out with its error ([`truncation`]).
        if !matches!(
            summary["status"].as_str(),
            Some("finished" | "failed" | "interrupted")
        ) {
            return Err(invalid(
                dir,
                format!(
                    "not a finished run (summary.json has status {}): finish it with `fedsel run --resume`",
                    summary["status"]
                ),
            )
            .into());
        }
    }
    if let Some(why) = truncation(dir)? {
        return Ok(Read::LeftOut(why));
    }
    let text = std::fs::read_to_string(&path).map_err(|source| fedsel::error::Error::Output {
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
    Ok(Read::Run(flat, seed))
}

/// Whether `key` is one of the [`TASK`] keys or lies under one.
fn is_task(key: &str) -> bool {
    TASK.iter().any(|t| {
        key.strip_prefix(t)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    })
}

/// The shortest end of `key`, in whole dotted parts, that no other key of `all` ends with:
/// `lr` for `train.lr`, `scheme.kind` for `partition.scheme.kind` beside `model.kind`.
fn short_key<'a>(key: &'a str, all: &BTreeSet<&String>) -> &'a str {
    let ends = |k: &str, end: &str| k == end || k.ends_with(&format!(".{end}"));
    let starts = std::iter::once(0).chain(key.match_indices('.').map(|(i, _)| i + 1));
    let mut candidates: Vec<&str> = starts.map(|i| &key[i..]).collect();
    candidates.reverse();
    candidates
        .into_iter()
        .find(|end| all.iter().filter(|k| ends(k, end)).count() == 1)
        .unwrap_or(key)
}

/// Groups run directories into arms, in the order of their first run; a run that is not
/// whole ([`truncation`]) is left out and named. Two runs of one arm with one seed (a
/// directory named twice, a copy) are refused: seeds pair runs across arms. Arms whose
/// [`TASK`] keys differ are refused ([`Error::MixedTasks`]) unless `allow_mixed`; every run
/// left out is [`Error::NothingLeft`].
pub fn arms(dirs: &[PathBuf], allow_mixed: bool) -> Result<Arms> {
    let mut configs: Vec<BTreeMap<String, String>> = Vec::new();
    let mut members: Vec<Vec<(PathBuf, String)>> = Vec::new();
    let mut left_out = Vec::new();
    for dir in dirs {
        let (config, seed) = match read_config(dir)? {
            Read::Run(config, seed) => (config, seed),
            Read::LeftOut(why) => {
                left_out.push(LeftOut {
                    dir: dir.clone(),
                    why,
                });
                continue;
            }
        };
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
    if configs.is_empty() {
        return Err(Error::NothingLeft { left_out });
    }
    let keys: BTreeSet<&String> = configs.iter().flat_map(|c| c.keys()).collect();
    let mut differing: Vec<&String> = keys
        .iter()
        .copied()
        .filter(|k| configs.iter().any(|c| c.get(*k) != configs[0].get(*k)))
        .collect();
    differing.sort_by_key(|k| *k != STRATEGY);
    let value = |config: &BTreeMap<String, String>, k: &str| {
        config.get(k).map_or("-", String::as_str).to_string()
    };
    // Keys of a tagged table whose kind differs (a dataset's parameters beside
    // `dataset.kind`) follow from the kind: named apart they only repeat it.
    let implied = |k: &&String| {
        k.match_indices('.').any(|(i, _)| {
            let kind = format!("{}.kind", &k[..i]);
            **k != kind && differing.iter().any(|d| **d == kind)
        })
    };
    let mixed: Vec<Difference> = differing
        .iter()
        .filter(|k| is_task(k) && !implied(k))
        .map(|k| {
            let mut values: Vec<(String, PathBuf)> = Vec::new();
            for (config, members) in configs.iter().zip(&members) {
                let v = value(config, k);
                if values.iter().all(|(seen, _)| *seen != v) {
                    values.push((v, members[0].0.clone()));
                }
            }
            Difference {
                key: (*k).clone(),
                values,
            }
        })
        .collect();
    if !mixed.is_empty() && !allow_mixed {
        return Err(Error::MixedTasks { differences: mixed });
    }
    let label = |config: &BTreeMap<String, String>, shown: &[&&String]| match shown.is_empty() {
        true => format!("{}={}", short_key(STRATEGY, &keys), value(config, STRATEGY)),
        false => shown
            .iter()
            .map(|k| format!("{}={}", short_key(k, &keys), value(config, k)))
            .collect::<Vec<_>>()
            .join(", "),
    };
    // The implied keys are left out of the names too, unless two arms differ only in them.
    let brief: Vec<&&String> = differing.iter().filter(|k| !implied(k)).collect();
    let brief_labels: BTreeSet<String> = configs.iter().map(|c| label(c, &brief)).collect();
    let shown: Vec<&&String> = match brief_labels.len() == configs.len() {
        true => brief,
        false => differing.iter().collect(),
    };
    let arms = configs
        .iter()
        .zip(members)
        .map(|(config, members)| Arm {
            label: label(config, &shown),
            dirs: members.into_iter().map(|m| m.0).collect(),
        })
        .collect();
    Ok(Arms {
        arms,
        left_out,
        mixed,
    })
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

    /// A whole finished run of one round.
    fn run(root: &Path, name: &str, config: &str) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.resolved.toml"), config).unwrap();
        std::fs::write(
            dir.join("summary.json"),
            r#"{"status": "finished", "rounds": 1}"#,
        )
        .unwrap();
        std::fs::write(dir.join("metrics.csv"), "round,test_acc\n0,0.5\n").unwrap();
        dir
    }

    fn labels(arms: &Arms) -> Vec<&str> {
        arms.arms.iter().map(|a| a.label.as_str()).collect()
    }

    /// Seeds (and an unpinned data seed, a name, a checkpoint interval, a TensorBoard
    /// directory) do not split an arm; the strategy and the learning rate do, and label the arms by their short keys;
    /// a pinned data seed that differs is a difference.
    #[test]
    fn runs_group_by_config_without_seed_and_are_named_by_what_differs() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = |seed: u64, strategy: &str, lr: f64, extra: &str| {
            format!(
                "name = \"r{seed}\"\nseed = {seed}\ndata_seed = {seed}\ncheckpoint_every = {seed}\n{extra}[selection]\nstrategy = \"{strategy}\"\n[train]\nlr = {lr}\n[server]\nlr = 1.0\n"
            )
        };
        let dirs = [
            run(tmp.path(), "a", &cfg(1, "uniform", 0.1, "")),
            run(tmp.path(), "b", &cfg(1, "powd", 0.1, "")),
            run(
                tmp.path(),
                "c",
                &cfg(2, "uniform", 0.1, "[output]\ntensorboard = \"/tb/c\"\n"),
            ),
            run(tmp.path(), "d", &cfg(1, "powd", 0.05, "")),
        ];
        let arms = arms(&dirs, false).unwrap();
        assert_eq!(
            labels(&arms),
            [
                "strategy=uniform, train.lr=0.1",
                "strategy=powd, train.lr=0.1",
                "strategy=powd, train.lr=0.05"
            ]
        );
        assert_eq!(arms.arms[0].dirs, [dirs[0].clone(), dirs[2].clone()]);
        assert!(arms.left_out.is_empty() && arms.mixed.is_empty());
        let one = super::arms(&dirs[..1], false).unwrap();
        assert_eq!(labels(&one), ["strategy=uniform"]);
        let pinned = run(
            tmp.path(),
            "e",
            &cfg(3, "uniform", 0.1, "").replace("data_seed = 3", "data_seed = 1"),
        );
        let two = super::arms(&[dirs[0].clone(), pinned], false).unwrap();
        assert_eq!(labels(&two), ["data_seed=-", "data_seed=1"]);
        // Round policies differ as wholes: one key, named by policy and parameter.
        let policy = |name: &str, round: &str| {
            let extra = format!("[system]\nkind = \"lognormal\"\n[system.round]\n{round}\n");
            run(tmp.path(), name, &cfg(1, "uniform", 0.1, &extra))
        };
        let rounds = super::arms(
            &[
                policy("f", "policy = \"overcommit\"\novercommit = 0.3"),
                policy("g", "policy = \"deadline\"\ndeadline_s = 30.0"),
            ],
            false,
        )
        .unwrap();
        assert_eq!(
            labels(&rounds),
            ["round=overcommit-0.3", "round=deadline-30.0s"]
        );
        // A policy of several parameters names each.
        let buffered = super::arms(
            &[
                policy(
                    "h",
                    "policy = \"fedbuff\"\nconcurrency = 10\nbuffer_size = 6",
                ),
                policy("i", "policy = \"overcommit\"\novercommit = 0.3"),
            ],
            false,
        )
        .unwrap();
        assert_eq!(
            labels(&buffered),
            [
                "round=fedbuff buffer_size=6 concurrency=10",
                "round=overcommit-0.3"
            ]
        );
    }

    /// A key is shortened to the fewest trailing parts no other key ends with.
    #[test]
    fn keys_are_shortened_to_an_end_no_other_key_shares() {
        let keys = [
            "selection.strategy",
            "model.kind",
            "partition.scheme.kind",
            "train.lr",
            "lr",
        ]
        .map(String::from);
        let all: BTreeSet<&String> = keys.iter().collect();
        let short: Vec<&str> = keys.iter().map(|k| short_key(k, &all)).collect();
        assert_eq!(
            short,
            ["strategy", "model.kind", "scheme.kind", "train.lr", "lr"]
        );
    }

    /// Runs of two datasets and targets are refused, naming each key that differs with its
    /// values and a run that has each, but not the parameters of one dataset kind (they
    /// follow from the kind); allowed, they are grouped and the difference kept. Keys outside
    /// the task (the strategy) never refuse. Arms that differ only in such a parameter keep
    /// it in their names.
    #[test]
    fn runs_of_different_tasks_are_refused_unless_allowed() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = |dataset: &str, targets: &str, strategy: &str| {
            let alpha = match dataset {
                "synthetic" => "alpha = 0.5\n",
                _ => "",
            };
            format!(
                "seed = 1\ntargets = {targets}\n[dataset]\nkind = \"{dataset}\"\n{alpha}[model]\nkind = \"cnn\"\n[selection]\nstrategy = \"{strategy}\"\n"
            )
        };
        let a = run(tmp.path(), "a", &cfg("fmnist", "[0.69]", "fedcor"));
        let b = run(tmp.path(), "b", &cfg("synthetic", "[0.5]", "uniform"));
        let err = arms(&[a.clone(), b.clone()], false).unwrap_err();
        let Error::MixedTasks { differences } = &err else {
            panic!("{err}")
        };
        let keys: Vec<&str> = differences.iter().map(|d| d.key.as_str()).collect();
        assert_eq!(keys, ["dataset.kind", "targets"]);
        assert_eq!(
            differences[0].values,
            [
                ("fmnist".to_string(), a.clone()),
                ("synthetic".into(), b.clone())
            ]
        );
        let text = err.to_string();
        assert!(
            text.contains("`targets` is [0.69] (`") && text.contains("or [0.5] (`"),
            "{text}"
        );
        let allowed = arms(&[a.clone(), b], true).unwrap();
        assert_eq!(allowed.mixed, *differences);
        assert_eq!(
            labels(&allowed)[0],
            "strategy=fedcor, dataset.kind=fmnist, targets=[0.69]"
        );
        let c = run(tmp.path(), "c", &cfg("fmnist", "[0.69]", "uniform"));
        assert!(arms(&[a.clone(), c], false).unwrap().mixed.is_empty());
        let d = run(
            tmp.path(),
            "d",
            &cfg("synthetic", "[0.69]", "fedcor").replace("0.5", "1.0"),
        );
        let e = run(tmp.path(), "e", &cfg("synthetic", "[0.69]", "fedcor"));
        let three = arms(&[a, d, e], true).unwrap();
        assert_eq!(
            labels(&three),
            [
                "alpha=-, dataset.kind=fmnist",
                "alpha=1.0, dataset.kind=synthetic",
                "alpha=0.5, dataset.kind=synthetic"
            ]
        );
        let keys: Vec<&str> = three.mixed.iter().map(|d| d.key.as_str()).collect();
        assert_eq!(keys, ["dataset.kind"]);
    }

    /// A run without summary.json, one whose metrics.csv was cut to fewer rows, one ending
    /// at another round than its summary's and one broken off mid-row are left out, each
    /// with its reason; the whole run stays. With every run left out, nothing is reported.
    #[test]
    fn runs_that_are_not_whole_are_left_out_and_named() {
        let tmp = tempfile::tempdir().unwrap();
        let whole = |name: &str, seed: u64| {
            let dir = run(tmp.path(), name, &format!("seed = {seed}\n"));
            std::fs::write(
                dir.join("summary.json"),
                r#"{"status": "finished", "rounds": 3}"#,
            )
            .unwrap();
            std::fs::write(
                dir.join("metrics.csv"),
                "round,test_acc\n0,0.1\n1,0.2\n2,0.3\n",
            )
            .unwrap();
            dir
        };
        let good = whole("good", 1);
        let no_summary = whole("no_summary", 2);
        std::fs::remove_file(no_summary.join("summary.json")).unwrap();
        let cut = whole("cut", 3);
        std::fs::write(cut.join("metrics.csv"), "round,test_acc\n0,0.1\n1,0.2\n").unwrap();
        let skewed = whole("skewed", 4);
        std::fs::write(
            skewed.join("metrics.csv"),
            "round,test_acc\n0,0.1\n1,0.2\n1,0.2\n",
        )
        .unwrap();
        let broken = whole("broken", 5);
        std::fs::write(
            broken.join("metrics.csv"),
            "round,test_acc\n0,0.1\n1,0.2\n2\n",
        )
        .unwrap();
        let failed = whole("failed", 6);
        std::fs::write(
            failed.join("summary.json"),
            r#"{"status": "failed", "error": "boom", "rounds_completed": 2}"#,
        )
        .unwrap();
        let dirs = [good.clone(), no_summary, cut, skewed, broken, failed];
        let arms = arms(&dirs, false).unwrap();
        assert_eq!(arms.arms.len(), 1);
        assert_eq!(arms.arms[0].dirs, std::slice::from_ref(&good));
        let why: Vec<(&Path, &str)> = arms
            .left_out
            .iter()
            .map(|l| (l.dir.as_path(), l.why.as_str()))
            .collect();
        assert_eq!(
            why[..3],
            [
                (
                    dirs[1].as_path(),
                    "truncated: it has no summary.json (the run stopped before it finished)"
                ),
                (
                    dirs[2].as_path(),
                    "truncated: metrics.csv holds 2 of the 3 rounds in summary.json"
                ),
                (
                    dirs[3].as_path(),
                    "truncated: metrics.csv ends at round 2, summary.json at round 3"
                ),
            ]
        );
        assert_eq!(why[3].0, dirs[4].as_path());
        assert!(
            why[3]
                .1
                .starts_with("truncated: metrics.csv breaks off after 2 rows"),
            "{}",
            why[3].1
        );
        // A failed run is left out with its error, not a reason to abort the report.
        assert_eq!(
            why[4],
            (
                dirs[5].as_path(),
                "failed after 2 rounds (boom); it has no checkpoint to resume from"
            )
        );
        let err = super::arms(&dirs[1..], false).unwrap_err();
        assert!(
            matches!(&err, Error::NothingLeft { left_out } if left_out.len() == 5),
            "{err}"
        );
    }

    /// A directory named twice, a directory that is no run, an unfinished run and an output
    /// directory inside the compared runs are refused, each naming what is wrong.
    #[test]
    fn mistakes_name_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let a = run(tmp.path(), "a", "seed = 1\n");
        let err = arms(&[a.clone(), a.clone()], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("one seed (1)") && err.contains("/a`"), "{err}");
        let err = arms(&[tmp.path().to_path_buf()], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a run directory"), "{err}");
        std::fs::write(a.join("summary.json"), r#"{"status": "running"}"#).unwrap();
        let err = arms(std::slice::from_ref(&a), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not a finished run") && err.contains("running"),
            "{err}"
        );
        let err = check_out(&a, std::slice::from_ref(&a))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--out"), "{err}");
        check_out(&tmp.path().join("cmp"), &[a]).unwrap();
    }
}

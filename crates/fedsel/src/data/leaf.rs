//! LEAF's federated datasets (FEMNIST, Shakespeare, Synthetic, ...) as its preprocessing
//! scripts leave them: a directory with `train/*.json` and `test/*.json`, each file
//! `{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}`.
//!
//! Every user of the train files becomes one client holding its own examples, in the
//! files' order (files by name, users as listed), so a natural partition reproduces LEAF's
//! clients. The test files' examples are pooled into the server's test set. A client's
//! held-out part follows [`LeafHoldout`]: by default the user's own test examples, so
//! clients train on every LEAF training example as LEAF's baselines do (its `main.py` gives
//! each client its `train_data[u]` and `test_data[u]`); or, as before, a seeded split of
//! the user's training examples. Inputs are numeric vectors (FEMNIST's 784 pixels,
//! Synthetic's 60 features) or character sequences (Shakespeare's 80-character windows, the
//! next character as label, ids in LEAF's vocabulary). Each user's data is parsed on its
//! own, so an error names the file and the user.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::builder::{DatasetBuilder, RawInput, RawLabel};
use super::{Dataset, FederatedData, read_file};
use crate::config::LeafHoldout;
use crate::error::DataError;

/// How the examples are read.
#[derive(Debug, Clone, Default)]
pub struct LeafSpec {
    /// Reshapes each feature vector (FEMNIST: `[1, 28, 28]` for the CNNs); `None` keeps
    /// the shape the JSON nesting gives.
    pub shape: Option<Vec<usize>>,
    /// Number of classes; `None` = one more than the largest label (a subset of FEMNIST
    /// may not hold all 62).
    pub classes: Option<usize>,
    /// Where each client's held-out part comes from.
    pub holdout: LeafHoldout,
}

/// One LEAF data file, each user's data left unparsed until its turn.
#[derive(Deserialize)]
struct LeafFile<'a> {
    users: Vec<String>,
    #[serde(default)]
    num_samples: Option<Vec<usize>>,
    #[serde(borrow)]
    user_data: HashMap<String, &'a RawValue>,
}

/// One user's examples.
#[derive(Deserialize)]
struct UserData {
    x: Vec<RawInput>,
    y: Vec<RawLabel>,
}

/// Loads the LEAF dataset under `dir`.
pub fn load(dir: &Path, spec: &LeafSpec) -> Result<FederatedData, DataError> {
    let (train_files, test_files) = (json_files(dir, "train")?, json_files(dir, "test")?);
    let mut train = DatasetBuilder::default();
    let mut names: HashMap<String, usize> = HashMap::new();
    let mut users = Vec::new();
    for file in &train_files {
        let bytes = read_file(file)?;
        for (user, range) in parse_file(file, &bytes, &mut train)? {
            if names.insert(user.clone(), users.len()).is_some() {
                return Err(corrupt(
                    file,
                    format!("user `{user}` appears a second time"),
                ));
            }
            if range.is_empty() {
                return Err(corrupt(file, format!("user `{user}` has no examples")));
            }
            users.push(range.collect());
        }
    }
    let name = format!("leaf:{}", label(dir));
    Ok(match spec.holdout {
        LeafHoldout::Split => {
            let (train, test) = separate_sets(dir, &test_files, train, spec)?;
            natural(
                format!("{name} [held out: a split of each user's LEAF train data]"),
                train,
                test,
                users,
                None,
            )
        }
        LeafHoldout::LeafTest => {
            let (train, test, held) = test_appended(dir, &test_files, train, &names, spec)?;
            natural(
                format!("{name} [held out: each user's LEAF test data]"),
                train,
                test,
                users,
                Some(held),
            )
        }
    })
}

/// The training pool with the test examples appended after the training ones, so that a
/// client's held-out indices point at its own test examples; the server's test set is cut
/// from the pool afterwards, so the test files are parsed once. `names` maps each training
/// user to its client; returns the pool, the test set and each client's held-out indices.
fn test_appended(
    dir: &Path,
    test_files: &[PathBuf],
    mut pool: DatasetBuilder,
    names: &HashMap<String, usize>,
    spec: &LeafSpec,
) -> Result<(Dataset, Dataset, Vec<Vec<usize>>), DataError> {
    let n_train = pool.len();
    let mut held: Vec<Option<Vec<usize>>> = vec![None; names.len()];
    for file in test_files {
        let bytes = read_file(file)?;
        for (user, range) in parse_file(file, &bytes, &mut pool)? {
            let &k = names.get(&user).ok_or_else(|| {
                corrupt(
                    file,
                    format!(
                        "user `{user}` has test examples but no training examples; \
                         dataset.holdout = \"leaf_test\" holds out each user's own test data \
                         (LEAF's `-t sample` split): use dataset.holdout = \"split\" for \
                         a `-t user` split"
                    ),
                )
            })?;
            if held[k].replace(range.collect()).is_some() {
                return Err(corrupt(
                    file,
                    format!("user `{user}` appears a second time in the test files"),
                ));
            }
        }
    }
    if pool.len() == n_train {
        return Err(no_tests(dir));
    }
    let pool = pool.finish(dir, spec.shape.as_deref(), spec.classes)?;
    let test = pool.subset(&(n_train..pool.len()).collect::<Vec<_>>());
    let held = held.into_iter().map(Option::unwrap_or_default).collect();
    Ok((pool, test, held))
}

/// The data of a LEAF directory, its users the natural clients.
fn natural(
    name: String,
    train: Dataset,
    test: Dataset,
    users: Vec<Vec<usize>>,
    user_holdout: Option<Vec<Vec<usize>>>,
) -> FederatedData {
    FederatedData {
        name,
        train,
        test,
        users: Some(users),
        user_models: None,
        user_holdout,
    }
}

/// The training set and the pooled test set, read into separate pools.
fn separate_sets(
    dir: &Path,
    test_files: &[PathBuf],
    train: DatasetBuilder,
    spec: &LeafSpec,
) -> Result<(Dataset, Dataset), DataError> {
    let mut test = DatasetBuilder::default();
    for file in test_files {
        let bytes = read_file(file)?;
        parse_file(file, &bytes, &mut test)?;
    }
    if test.is_empty() {
        return Err(no_tests(dir));
    }
    // Both sets take the classes either implies, so they agree on the output layer.
    let classes = spec
        .classes
        .unwrap_or(train.classes_found().max(test.classes_found()));
    let train = train.finish(&dir.join("train"), spec.shape.as_deref(), Some(classes))?;
    let test = test.finish(&dir.join("test"), spec.shape.as_deref(), Some(classes))?;
    if test.inputs.row_len() != train.inputs.row_len() {
        return Err(corrupt(
            &dir.join("test"),
            format!(
                "test examples have {} values, train examples {}",
                test.inputs.row_len(),
                train.inputs.row_len()
            ),
        ));
    }
    Ok((train, test))
}

fn no_tests(dir: &Path) -> DataError {
    corrupt(&dir.join("test"), "holds no test examples".into())
}

/// The last two components of `dir` (`femnist/data` for `leaf/data/femnist/data`): every
/// LEAF dataset's directory is called `data`, so its parent names the dataset.
fn label(dir: &Path) -> String {
    let mut parts = Vec::new();
    for c in dir.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_string_lossy()),
            Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    match parts.len() {
        0 => dir.display().to_string(),
        n => parts[n.saturating_sub(2)..].join("/"),
    }
}

/// Parses one data file into `out`; returns each listed user with the range of its examples.
pub fn parse_file(
    path: &Path,
    bytes: &[u8],
    out: &mut DatasetBuilder,
) -> Result<Vec<(String, std::ops::Range<usize>)>, DataError> {
    let file: LeafFile = serde_json::from_slice(bytes)
        .map_err(|e| corrupt(path, format!("not a LEAF data file: {e}")))?;
    if let Some(n) = &file.num_samples
        && n.len() != file.users.len()
    {
        return Err(corrupt(
            path,
            format!("{} users but {} num_samples", file.users.len(), n.len()),
        ));
    }
    let listed: HashSet<&str> = file.users.iter().map(String::as_str).collect();
    if let Some(extra) = file.user_data.keys().find(|u| !listed.contains(u.as_str())) {
        return Err(corrupt(
            path,
            format!("user_data holds `{extra}`, who is not in `users`"),
        ));
    }
    let mut ranges = Vec::with_capacity(file.users.len());
    for (i, user) in file.users.iter().enumerate() {
        let in_user = |reason: String| corrupt(path, format!("user `{user}`: {reason}"));
        let raw = file
            .user_data
            .get(user)
            .ok_or_else(|| in_user("listed in `users` but absent from user_data".into()))?;
        let data: UserData = serde_json::from_str(raw.get()).map_err(|e| in_user(e.to_string()))?;
        if data.x.len() != data.y.len() {
            return Err(in_user(format!(
                "{} inputs but {} labels",
                data.x.len(),
                data.y.len()
            )));
        }
        if let Some(&n) = file.num_samples.as_ref().map(|n| &n[i])
            && n != data.x.len()
        {
            return Err(in_user(format!(
                "num_samples says {n}, the data holds {}",
                data.x.len()
            )));
        }
        let start = out.len();
        for (j, (x, y)) in data.x.iter().zip(&data.y).enumerate() {
            out.push(x, y)
                .map_err(|e| in_user(format!("example {j}: {e}")))?;
        }
        ranges.push((user.clone(), start..out.len()));
    }
    Ok(ranges)
}

/// The `.json` files of `dir/sub`, by name.
fn json_files(dir: &Path, sub: &str) -> Result<Vec<PathBuf>, DataError> {
    let d = dir.join(sub);
    let missing = || DataError::Missing {
        dataset: "leaf".into(),
        dir: dir.to_path_buf(),
        missing: format!("{sub}/*.json"),
        hint: "`dataset.path` must name a LEAF data directory (the one holding `train/` and \
               `test/`, e.g. `leaf/data/femnist/data`)"
            .into(),
    };
    let entries = std::fs::read_dir(&d).map_err(|_| missing())?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| DataError::Io {
                path: d.clone(),
                error: e,
            })?
            .path();
        if path.extension().is_some_and(|e| e == "json") && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(missing());
    }
    files.sort();
    Ok(files)
}

fn corrupt(path: &Path, reason: String) -> DataError {
    DataError::Corrupt {
        path: path.to_path_buf(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, DatasetConfig, PartitionConfig};
    use crate::data::Inputs;
    use crate::partition;

    fn write(dir: &Path, sub: &str, name: &str, body: &serde_json::Value) {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        std::fs::write(dir.join(sub).join(name), body.to_string()).unwrap();
    }

    /// A user's name, inputs and labels.
    type User<'a> = (&'a str, Vec<Vec<f32>>, Vec<u32>);

    fn user_file(users: &[User]) -> serde_json::Value {
        serde_json::json!({
            "users": users.iter().map(|u| u.0).collect::<Vec<_>>(),
            "num_samples": users.iter().map(|u| u.2.len()).collect::<Vec<_>>(),
            "user_data": users.iter().map(|(n, x, y)| (n.to_string(), serde_json::json!({"x": x, "y": y})))
                .collect::<serde_json::Map<_, _>>(),
        })
    }

    fn row(v: f32) -> Vec<f32> {
        vec![v, v + 0.5]
    }

    /// Three users in two train files (u3 in the later file), test examples for u1 and u2.
    fn three_users(dir: &Path) {
        write(
            dir,
            "train",
            "b.json",
            &user_file(&[("u3", vec![row(5.0)], vec![4])]),
        );
        write(
            dir,
            "train",
            "a.json",
            &user_file(&[
                ("u1", vec![row(1.0), row(2.0)], vec![0, 1]),
                ("u2", vec![row(3.0), row(4.0)], vec![1, 1]),
            ]),
        );
        write(
            dir,
            "test",
            "a.json",
            &user_file(&[
                ("u2", vec![row(8.0), row(7.0)], vec![0, 3]),
                ("u1", vec![row(9.0)], vec![2]),
            ]),
        );
    }

    fn split() -> LeafSpec {
        LeafSpec {
            holdout: LeafHoldout::Split,
            ..LeafSpec::default()
        }
    }

    fn dense(d: &crate::data::Dataset) -> &[f32] {
        let Inputs::Dense { values, .. } = &d.inputs else {
            panic!("dense")
        };
        values
    }

    /// By default clients train on exactly their LEAF training examples and hold out their
    /// own test examples, appended to the pool; the server tests on the pooled test files.
    #[test]
    fn by_default_a_user_holds_out_its_own_test_data() {
        let dir = tempfile::tempdir().unwrap();
        let leaf = dir.path().join("synthetic").join("data");
        three_users(&leaf);
        let d = load(&leaf, &LeafSpec::default()).unwrap();
        assert_eq!(
            d.name,
            "leaf:synthetic/data [held out: each user's LEAF test data]"
        );
        assert_eq!(d.users.clone().unwrap(), [vec![0, 1], vec![2, 3], vec![4]]);
        // The pool: 5 training examples, then the test file's 3 in file order.
        assert_eq!(d.train.labels, [0, 1, 1, 1, 4, 0, 3, 2]);
        assert_eq!(&dense(&d.train)[10..], &[8.0, 8.5, 7.0, 7.5, 9.0, 9.5][..]);
        assert_eq!(
            d.user_holdout.clone().unwrap(),
            [vec![7], vec![5, 6], vec![]],
            "u1's test example, u2's two, none for u3"
        );
        assert_eq!((d.test.labels.clone(), d.test.classes), (vec![0, 3, 2], 5));
        assert_eq!(dense(&d.test), &dense(&d.train)[10..]);

        let seed = 3;
        let clients = partition::build(&PartitionConfig::default(), &d, seed).unwrap();
        let train: Vec<_> = clients.iter().map(|c| c.train.clone()).collect();
        assert_eq!(train, d.users.clone().unwrap());
        assert_eq!(clients.iter().map(|c| c.train.len()).sum::<usize>(), 5);
        let held: Vec<_> = clients.iter().map(|c| c.holdout.clone()).collect();
        assert_eq!(held, d.user_holdout.unwrap());
    }

    /// `split` reads the directory as before `dataset.holdout` existed: the pool holds only
    /// training examples and the partition's seeded split makes the held-out parts.
    #[test]
    fn split_mode_splits_the_training_examples_as_before() {
        let dir = tempfile::tempdir().unwrap();
        three_users(dir.path());
        let d = load(dir.path(), &split()).unwrap();
        assert!(
            d.name
                .ends_with("[held out: a split of each user's LEAF train data]")
        );
        assert_eq!(d.train.labels, [0, 1, 1, 1, 4]);
        assert_eq!((d.test.labels.clone(), d.test.classes), (vec![0, 3, 2], 5));
        assert!(d.user_holdout.is_none());
        let cfg = PartitionConfig {
            holdout_fraction: 0.5,
            ..PartitionConfig::default()
        };
        let clients = partition::build(&cfg, &d, 3).unwrap();
        assert_eq!(
            clients,
            partition::split_holdout(d.users.clone().unwrap(), 0.5, 3)
        );
        let sizes: Vec<_> = clients.iter().map(|c| c.train.len()).collect();
        assert_eq!(sizes, [1, 1, 1], "⌈0.5 · n⌉ train, at least one");
    }

    #[test]
    fn a_test_user_without_training_data_is_named() {
        let dir = tempfile::tempdir().unwrap();
        three_users(dir.path());
        write(
            dir.path(),
            "test",
            "b.json",
            &user_file(&[("stranger", vec![row(1.0)], vec![0])]),
        );
        let e = load(dir.path(), &LeafSpec::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("b.json") && e.contains("user `stranger`") && e.contains("\"split\""),
            "{e}"
        );
        // Pooled into the server's test set, as before, when held-out parts are a split.
        assert_eq!(load(dir.path(), &split()).unwrap().test.len(), 4);

        write(
            dir.path(),
            "test",
            "b.json",
            &user_file(&[("u1", vec![row(1.0)], vec![0])]),
        );
        let e = load(dir.path(), &LeafSpec::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("b.json") && e.contains("user `u1` appears a second time"),
            "{e}"
        );
    }

    #[test]
    fn the_label_names_the_dataset_directory() {
        assert_eq!(label(Path::new("leaf/data/femnist/data")), "femnist/data");
        assert_eq!(label(Path::new("/x/shakespeare/data/")), "shakespeare/data");
        assert_eq!(label(Path::new("a/femnist/b/../data")), "femnist/data");
        assert_eq!(label(Path::new("data")), "data");
        assert_eq!(label(Path::new("/")), "/");
    }

    /// `leaf_test` needs LEAF's users as the clients; a fraction it ignores is flagged.
    #[test]
    fn leaf_test_holdout_needs_the_natural_partition() {
        let leaf = |o: &[&str]| {
            let mut all = vec![
                "dataset.kind=\"leaf\"".to_string(),
                "dataset.path=\"d\"".into(),
            ];
            all.extend(o.iter().map(|s| s.to_string()));
            Config::from_toml_str("", "t", &all)
        };
        let c = leaf(&[]).unwrap();
        assert!(matches!(
            c.dataset,
            DatasetConfig::Leaf {
                holdout: LeafHoldout::LeafTest,
                ..
            }
        ));
        assert!(c.to_resolved_toml().contains("holdout = \"leaf_test\""));
        assert!(c.warnings(10).is_empty());
        let e = leaf(&["partition.scheme.kind=\"iid\""])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dataset.holdout") && e.contains("partition.scheme"),
            "{e}"
        );
        leaf(&["partition.scheme.kind=\"iid\"", "dataset.holdout=\"split\""]).unwrap();
        let w = leaf(&["partition.holdout_fraction=0.1"])
            .unwrap()
            .warnings(10);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].key, "partition.holdout_fraction");
        let split = leaf(&[
            "partition.holdout_fraction=0.1",
            "dataset.holdout=\"split\"",
        ]);
        assert!(split.unwrap().warnings(10).is_empty());
    }

    #[test]
    fn users_become_clients_in_file_order_and_tests_pool() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "train",
            "b.json",
            &user_file(&[("u3", vec![row(5.0)], vec![4])]),
        );
        write(
            dir.path(),
            "train",
            "a.json",
            &user_file(&[
                ("u1", vec![row(1.0), row(2.0)], vec![0, 1]),
                ("u2", vec![row(3.0), row(4.0)], vec![1, 1]),
            ]),
        );
        write(
            dir.path(),
            "test",
            "a.json",
            &user_file(&[
                ("u1", vec![row(9.0)], vec![2]),
                ("u2", vec![row(8.0)], vec![0]),
            ]),
        );
        let d = load(dir.path(), &split()).unwrap();
        assert_eq!(d.users.unwrap(), [vec![0, 1], vec![2, 3], vec![4]]);
        assert_eq!(d.train.labels, [0, 1, 1, 1, 4]);
        assert_eq!(d.train.classes, 5);
        assert_eq!((d.test.labels.clone(), d.test.classes), (vec![2, 0], 5));
        let Inputs::Dense { shape, values } = &d.train.inputs else {
            panic!("dense")
        };
        assert_eq!(
            (shape.as_slice(), &values[..4]),
            (&[2][..], &[1.0, 1.5, 2.0, 2.5][..])
        );
    }

    #[test]
    fn a_bad_user_is_named_with_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = user_file(&[("alice", vec![vec![1.0]], vec![0])]);
        f["user_data"]["alice"]["y"] = serde_json::json!([0, 1]);
        write(dir.path(), "train", "t.json", &f);
        write(
            dir.path(),
            "test",
            "t.json",
            &user_file(&[("alice", vec![vec![1.0]], vec![0])]),
        );
        let e = load(dir.path(), &LeafSpec::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t.json")
                && e.contains("user `alice`")
                && e.contains("1 inputs but 2 labels"),
            "{e}"
        );

        f["user_data"]["alice"] = serde_json::json!({"x": [[1.0]], "y": ["?"]});
        write(dir.path(), "train", "t.json", &f);
        let e = load(dir.path(), &LeafSpec::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("user `alice`: example 0"), "{e}");

        let e = load(&dir.path().join("nowhere"), &LeafSpec::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("train/*.json"), "{e}");
    }
}

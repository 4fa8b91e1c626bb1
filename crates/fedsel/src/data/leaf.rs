//! LEAF's federated datasets (FEMNIST, Shakespeare, Synthetic, ...) as its preprocessing
//! scripts leave them: a directory with `train/*.json` and `test/*.json`, each file
//! `{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}`.
//!
//! Every user of the train files becomes one client holding its own examples, in the
//! files' order (files by name, users as listed), so a natural partition reproduces LEAF's
//! clients; the partition's `holdout_fraction` then splits each user's train part as for
//! any dataset. The test files' examples are pooled into the server's test set. Inputs are
//! numeric vectors (FEMNIST's 784 pixels, Synthetic's 60 features) or character
//! sequences (Shakespeare's 80-character windows, the next character as label, ids in
//! LEAF's vocabulary). Each user's data is parsed on its own, so an error names the file
//! and the user.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::builder::{DatasetBuilder, RawInput, RawLabel};
use super::{FederatedData, read_file};
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
    let mut users = Vec::new();
    let mut seen = HashSet::new();
    for file in &train_files {
        let bytes = read_file(file)?;
        for (user, range) in parse_file(file, &bytes, &mut train)? {
            if !seen.insert(user.clone()) {
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
    let mut test = DatasetBuilder::default();
    for file in &test_files {
        let bytes = read_file(file)?;
        parse_file(file, &bytes, &mut test)?;
    }
    if test.is_empty() {
        return Err(corrupt(&dir.join("test"), "holds no test examples".into()));
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
    Ok(FederatedData {
        name: format!(
            "leaf:{}",
            dir.file_name().map_or(dir.display().to_string(), |n| n
                .to_string_lossy()
                .into_owned())
        ),
        train,
        test,
        users: Some(users),
        user_models: None,
        user_holdout: None,
    })
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
    use crate::data::Inputs;

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

    #[test]
    fn users_become_clients_in_file_order_and_tests_pool() {
        let dir = tempfile::tempdir().unwrap();
        let row = |v: f32| vec![v, v + 0.5];
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
        let d = load(dir.path(), &LeafSpec::default()).unwrap();
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

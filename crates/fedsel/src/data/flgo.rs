//! Federated tasks as FLGo and its predecessor easyFL save them: a task directory whose
//! `data.json` fixes every client's data, so a fedsel run and an FLGo run of the same task
//! train on the same examples.
//!
//! Four layouts are read, told apart by their keys:
//! - easyFL `"store": "XY"` (the FedGS authors' Synthetic tasks): each client's `dtrain`
//!   and `dvalid` as `{"x", "y"}`, the server's `dtest` likewise. The client's `dvalid` is
//!   its held-out part under the natural partition.
//! - easyFL `"store": "IDX"`: the same with indices into the train and test sets of a
//!   dataset fedsel loads (`dataset.source`).
//! - FLGo's XY tasks (e.g. `synthetic_regression`): each client's `data` as `{"x", "y"}`,
//!   the server's `server.data` the test set. FLGo splits off validation data at run time
//!   by its own `train_holdout`; here the partition's `holdout_fraction` does.
//! - FLGo's tasks over a torchvision dataset: each client's `data` as indices into that
//!   dataset's train set (`dataset.source`), whose test set is the server's.
//!
//! Clients follow `client_names`; indices follow torchvision's order, which is the order of
//! the Fashion-MNIST IDX files and of the CIFAR binary batches fedsel reads.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::builder::{DatasetBuilder, RawInput, RawLabel};
use super::{FederatedData, read_file};
use crate::error::DataError;

/// The task file in a task directory.
pub const FILE: &str = "data.json";

/// How the examples are read (see [`super::leaf::LeafSpec`] for `shape` and `classes`).
#[derive(Debug, Clone, Default)]
pub struct FlgoSpec {
    /// Reshapes each feature vector of an XY task.
    pub shape: Option<Vec<usize>>,
    /// Number of classes of an XY task; `None` = one more than the largest label.
    pub classes: Option<usize>,
}

/// Loads the task in `dir`. `base` is the dataset an index task's indices point into.
pub fn load(
    dir: &Path,
    spec: &FlgoSpec,
    base: Option<FederatedData>,
) -> Result<FederatedData, DataError> {
    let path = dir.join(FILE);
    let bytes = read_file(&path)?;
    parse(&path, &bytes, spec, base)
}

/// Parses a `data.json` (named `path` in errors).
pub fn parse(
    path: &Path,
    bytes: &[u8],
    spec: &FlgoSpec,
    base: Option<FederatedData>,
) -> Result<FederatedData, DataError> {
    let corrupt = |reason: String| DataError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let task: Value = serde_json::from_slice(bytes)
        .map_err(|e| corrupt(format!("not an FLGo task file: {e}")))?;
    let names: Vec<String> = task
        .get("client_names")
        .and_then(|n| Vec::<String>::deserialize(n).ok())
        .ok_or_else(|| corrupt("no `client_names` list of strings".into()))?;
    if names.is_empty() {
        return Err(corrupt("`client_names` is empty".into()));
    }
    let client = |name: &str| {
        task.get(name)
            .ok_or_else(|| corrupt(format!("client `{name}` has no entry")))
    };
    let easyfl = task.get("store").map(|s| s.as_str());
    let indexed = match easyfl {
        Some(Some("XY")) => false,
        Some(Some("IDX")) => true,
        Some(other) => {
            return Err(corrupt(format!(
                "`store` is {}; fedsel reads \"XY\" and \"IDX\" tasks (labelled examples)",
                other.map_or("not a string".into(), |s| format!("\"{s}\""))
            )));
        }
        None => task.get("server").is_none_or(|s| s.get("data").is_none()),
    };
    let field = |name: &str, key: &str| -> Result<&Value, DataError> {
        client(name)?
            .get(key)
            .ok_or_else(|| corrupt(format!("client `{name}` has no `{key}`")))
    };
    let (train_key, valid_key) = if easyfl.is_some() {
        ("dtrain", Some("dvalid"))
    } else {
        ("data", None)
    };
    if indexed {
        let base = base.ok_or_else(|| {
            corrupt(
                "the clients' data are indices into a dataset: name it with `dataset.source` \
                 (fmnist, cifar10 or cifar100)"
                    .into(),
            )
        })?;
        let indices = |v: &Value, what: &str, limit: usize| -> Result<Vec<usize>, DataError> {
            let idx = Vec::<usize>::deserialize(v)
                .map_err(|e| corrupt(format!("{what}: not a list of indices ({e})")))?;
            match idx.iter().find(|&&i| i >= limit) {
                Some(i) => Err(corrupt(format!(
                    "{what}: index {i} is past the {limit} examples of `{}`",
                    base.name
                ))),
                None => Ok(idx),
            }
        };
        let n = base.train.len();
        let mut users = Vec::with_capacity(names.len());
        let mut held = Vec::with_capacity(names.len());
        for name in &names {
            users.push(indices(
                field(name, train_key)?,
                &format!("client `{name}`"),
                n,
            )?);
            if let Some(v) = valid_key {
                held.push(indices(
                    field(name, v)?,
                    &format!("client `{name}` {v}"),
                    n,
                )?);
            }
        }
        let test = match task.get("dtest") {
            Some(t) => base.test.subset(&indices(t, "dtest", base.test.len())?),
            None => base.test,
        };
        return Ok(FederatedData {
            name: format!("flgo:{}", base.name),
            train: base.train,
            test,
            users: Some(users),
            user_models: None,
            user_holdout: valid_key.map(|_| held),
        });
    }
    let mut train = DatasetBuilder::default();
    let mut users = Vec::with_capacity(names.len());
    let mut held = Vec::with_capacity(names.len());
    for name in &names {
        users.push(examples(
            field(name, train_key)?,
            &mut train,
            &corrupt,
            name,
        )?);
        if let Some(v) = valid_key {
            held.push(examples(field(name, v)?, &mut train, &corrupt, name)?);
        }
    }
    if let Some(k) = users.iter().position(|u| u.is_empty()) {
        return Err(corrupt(format!(
            "client `{}` has no training examples",
            names[k]
        )));
    }
    let test_set = match easyfl {
        Some(_) => task.get("dtest"),
        None => task.get("server").and_then(|s| s.get("data")),
    }
    .ok_or_else(|| corrupt("no server test set (`dtest` / `server.data`)".into()))?;
    let mut test = DatasetBuilder::default();
    examples(test_set, &mut test, &corrupt, "server")?;
    if test.is_empty() {
        return Err(corrupt("the server's test set is empty".into()));
    }
    let classes = spec
        .classes
        .unwrap_or(train.classes_found().max(test.classes_found()));
    let train = train.finish(path, spec.shape.as_deref(), Some(classes))?;
    let test = test.finish(path, spec.shape.as_deref(), Some(classes))?;
    if test.inputs.row_len() != train.inputs.row_len() {
        return Err(corrupt(format!(
            "test examples have {} values, training examples {}",
            test.inputs.row_len(),
            train.inputs.row_len()
        )));
    }
    let name = path
        .parent()
        .and_then(Path::file_name)
        .map_or("task".into(), |n| n.to_string_lossy().into_owned());
    Ok(FederatedData {
        name: format!("flgo:{name}"),
        train,
        test,
        users: Some(users),
        user_models: None,
        user_holdout: valid_key.map(|_| held),
    })
}

/// Appends the `{"x": [...], "y": [...]}` examples of `owner` to `out`; returns their indices.
fn examples(
    v: &Value,
    out: &mut DatasetBuilder,
    corrupt: &impl Fn(String) -> DataError,
    owner: &str,
) -> Result<Vec<usize>, DataError> {
    let fail = |reason: String| corrupt(format!("`{owner}`: {reason}"));
    let (Some(Value::Array(x)), Some(Value::Array(y))) = (v.get("x"), v.get("y")) else {
        return Err(fail("no `x` and `y` lists".into()));
    };
    if x.len() != y.len() {
        return Err(fail(format!("{} inputs but {} labels", x.len(), y.len())));
    }
    let start = out.len();
    for (j, (x, y)) in x.iter().zip(y).enumerate() {
        let input = RawInput::deserialize(x).map_err(|e| fail(format!("input {j}: {e}")))?;
        let label = RawLabel::deserialize(y).map_err(|e| fail(format!("label {j}: {e}")))?;
        out.push(&input, &label)
            .map_err(|e| fail(format!("example {j}: {e}")))?;
    }
    Ok((start..out.len()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Dataset, Inputs};
    use serde_json::json;

    fn parse_str(v: Value, base: Option<FederatedData>) -> Result<FederatedData, DataError> {
        parse(
            Path::new("task/data.json"),
            v.to_string().as_bytes(),
            &FlgoSpec::default(),
            base,
        )
    }

    #[test]
    fn easyfl_xy_keeps_each_clients_validation_part() {
        let task = json!({
            "store": "XY",
            "client_names": ["Client00", "Client01"],
            "dtest": {"x": [[0.0, 1.0]], "y": [3]},
            "Client00": {"dtrain": {"x": [[1.0, 2.0], [3.0, 4.0]], "y": [0, 1]},
                         "dvalid": {"x": [[5.0, 6.0]], "y": [2]}},
            "Client01": {"dtrain": {"x": [[7.0, 8.0]], "y": [1]},
                         "dvalid": {"x": [], "y": []}},
        });
        let d = parse_str(task, None).unwrap();
        assert_eq!(d.users.unwrap(), [vec![0, 1], vec![3]]);
        assert_eq!(d.user_holdout.unwrap(), [vec![2], vec![]]);
        assert_eq!(d.train.labels, [0, 1, 2, 1]);
        assert_eq!((d.train.classes, d.test.labels), (4, vec![3]));
    }

    #[test]
    fn flgo_index_tasks_point_into_the_source_dataset() {
        let set = |n: usize| Dataset {
            inputs: Inputs::Dense {
                shape: vec![1],
                values: (0..n).map(|i| i as f32).collect(),
            },
            labels: (0..n as u32).map(|i| i % 2).collect(),
            classes: 2,
        };
        let base = || FederatedData {
            name: "toy".into(),
            train: set(6),
            test: set(3),
            users: None,
            user_models: None,
            user_holdout: None,
        };
        let task = json!({"client_names": ["a", "b"], "a": {"data": [0, 5]}, "b": {"data": [2]}});
        let d = parse_str(task.clone(), Some(base())).unwrap();
        assert_eq!(d.users.unwrap(), [vec![0, 5], vec![2]]);
        assert!(d.user_holdout.is_none());
        assert_eq!(d.test.len(), 3);
        let e = parse_str(task, None).unwrap_err().to_string();
        assert!(e.contains("dataset.source"), "{e}");
        let bad = json!({"client_names": ["a"], "a": {"data": [6]}});
        let e = parse_str(bad, Some(base())).unwrap_err().to_string();
        assert!(
            e.contains("client `a`: index 6 is past the 6 examples"),
            "{e}"
        );
    }

    #[test]
    fn flgo_xy_tasks_read_the_servers_test_set_and_name_bad_clients() {
        let task = json!({
            "client_names": ["c0"],
            "server": {"data": {"x": [[1.0]], "y": [1]}},
            "c0": {"data": {"x": [[2.0], [3.0]], "y": [0, 1]}},
        });
        let d = parse_str(task.clone(), None).unwrap();
        assert_eq!(
            (d.users.unwrap(), d.test.labels),
            (vec![vec![0, 1]], vec![1])
        );
        let mut bad = task;
        bad["c0"]["data"]["y"] = json!([0]);
        let e = parse_str(bad, None).unwrap_err().to_string();
        assert!(e.contains("`c0`: 2 inputs but 1 labels"), "{e}");
    }
}

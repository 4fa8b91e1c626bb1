//! FedScale's own device files, as its users have them: the pickled
//! `client_device_capacity` (`client_id -> {'computation': ms per sample of inference,
//! 'communication': kbit/s}`) and `client_behave_trace` (`client_id -> {'active': [s],
//! 'inactive': [s], 'finish_time': s, ...}`), from `benchmark/dataset/data/device_info` in
//! SymbioticLab/FedScale.
//!
//! # Which entry a client gets
//!
//! FedScale's aggregator numbers its simulated clients from 1 (`client_register_handler`:
//! "the worker rankId starts from 1"), so fedsel's client `k` is FedScale's client `k + 1`.
//! With `n` entries in a file:
//! - the device file is looked up by *key*: client `k` gets the entry whose key is the
//!   integer `(k + 1) mod n` (the aggregator's `mapped_id`);
//! - the behave trace is looked up by *position*: client `k` gets the `((k + 1) mod n)`-th
//!   entry in the file's order (the client manager's `user_trace_keys[client_id % n]`,
//!   whose keys are the dict's insertion order, which a pickle keeps).
//!
//! So with fewer clients than entries, client `k` reads entry `k + 1`, and with more, the
//! entries are reused cyclically. Where FedScale falls back to `{'computation': 1,
//! 'communication': 1}` for a key the device file lacks, fedsel refuses the file and names
//! the client and the key: a silent default device would distort every time measured.

use std::path::Path;

use serde_pickle::{HashableValue, Value};

use crate::error::{DataError, Result, read_file};
use crate::system::behave::Activity;
use crate::system::pickle;
use crate::system::profile::Profile;

/// The entries of the pickled dict in `bytes`, in the file's order (the behave trace is
/// mapped by position), with at least one entry. NumPy scalars and 1-D arrays of bool,
/// int and float read as Python values; other objects are refused, named.
fn entries(path: &Path, bytes: &[u8]) -> std::result::Result<Vec<(Value, Value)>, DataError> {
    let entries = pickle::dict_entries(bytes).map_err(|e| {
        DataError::corrupt(path, format!("not a pickled dict of client entries: {e}"))
    })?;
    if entries.is_empty() {
        return Err(DataError::corrupt(path, "the dict has no client entries"));
    }
    Ok(entries)
}

/// The index FedScale maps fedsel's client `k` to among `n` entries.
fn mapped(k: usize, n: usize) -> usize {
    (k + 1) % n
}

/// A number of a pickled entry (a Python int or float).
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::I64(i) => Some(*i as f64),
        Value::F64(x) => Some(*x),
        _ => None,
    }
}

/// Reads what an entry holds under `key`, or says what is wrong with it.
fn field<'v>(entry: &'v Value, key: &str) -> std::result::Result<&'v Value, String> {
    let Value::Dict(d) = entry else {
        return Err(format!("the entry is `{entry}`, not a dict"));
    };
    d.get(&HashableValue::String(key.into()))
        .ok_or_else(|| format!("`{key}` is missing"))
}

/// A finite number > 0 under `key`.
fn positive(entry: &Value, key: &str) -> std::result::Result<f64, String> {
    let v = field(entry, key)?;
    number(v)
        .filter(|x| x.is_finite() && *x > 0.0)
        .ok_or_else(|| format!("`{key}` is `{v}`, not a finite number > 0"))
}

/// A list of numbers under `key` (a list or a tuple), each checked later.
fn times(entry: &Value, key: &str) -> std::result::Result<Vec<f64>, String> {
    let v = field(entry, key)?;
    let (Value::List(items) | Value::Tuple(items)) = v else {
        return Err(format!("`{key}` is `{v}`, not a list of seconds"));
    };
    items
        .iter()
        .map(|x| number(x).ok_or_else(|| format!("`{key}` holds `{x}`, not a number")))
        .collect()
}

/// Reads a `client_device_capacity` pickle for `clients` clients (see the module's
/// mapping). Only the entries some client maps to are read.
pub fn load_devices(path: &Path, clients: usize) -> Result<Vec<Profile>> {
    parse_devices(path, &read_file(path)?, clients)
}

/// Parses `client_device_capacity` bytes. Errors name the file, the client and the key.
pub fn parse_devices(path: &Path, bytes: &[u8], clients: usize) -> Result<Vec<Profile>> {
    let entries = entries(path, bytes)?;
    let n = entries.len();
    let by_key: std::collections::HashMap<i64, &Value> = entries
        .iter()
        .filter_map(|(key, v)| match key {
            Value::I64(i) => Some((*i, v)),
            _ => None,
        })
        .collect();
    (0..clients)
        .map(|k| {
            let key = mapped(k, n);
            let bad = |reason: String| {
                DataError::corrupt(
                    path,
                    format!("client {k} (the file's client {key}): {reason}"),
                )
            };
            let entry = by_key.get(&(key as i64)).ok_or_else(|| {
                bad(format!(
                    "no entry has the integer key {key} (FedScale's (client + 1) mod {n} entries)"
                ))
            })?;
            Ok(Profile {
                compute_ms_per_sample: positive(entry, "computation").map_err(bad)?,
                bandwidth_kbps: positive(entry, "communication").map_err(bad)?,
            })
        })
        .collect()
}

/// Reads a `client_behave_trace` pickle for `clients` clients (see the module's mapping).
pub fn load_behave(path: &Path, clients: usize) -> Result<Vec<Activity>> {
    parse_behave(path, &read_file(path)?, clients)
}

/// Parses `client_behave_trace` bytes. Errors name the file, the client and the key.
pub fn parse_behave(path: &Path, bytes: &[u8], clients: usize) -> Result<Vec<Activity>> {
    let entries = entries(path, bytes)?;
    let n = entries.len();
    (0..clients)
        .map(|k| {
            let (key, entry) = &entries[mapped(k, n)];
            let activity = times(entry, "active").and_then(|active| {
                let inactive = times(entry, "inactive")?;
                let finish = field(entry, "finish_time")?;
                let finish = number(finish)
                    .ok_or_else(|| format!("`finish_time` is `{finish}`, not a number"))?;
                Activity::new(active, inactive, finish)
            });
            activity.map_err(|reason| {
                DataError::corrupt(
                    path,
                    format!("client {k} (the file's client {key}): {reason}"),
                )
                .into()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde::Serialize;
    use serde_pickle::SerOptions;

    use super::*;

    /// A Python value as the test files hold it; dicts keep the order they are written in,
    /// as Python's do.
    #[derive(Clone)]
    enum Py {
        Int(i64),
        Float(f64),
        Str(&'static str),
        List(Vec<f64>),
        Dict(Vec<(&'static str, Py)>),
    }

    impl Serialize for Py {
        fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            match self {
                Py::Int(i) => s.serialize_i64(*i),
                Py::Float(x) => s.serialize_f64(*x),
                Py::Str(v) => s.serialize_str(v),
                Py::List(v) => v.serialize(s),
                Py::Dict(d) => s.collect_map(d.iter().map(|(k, v)| (k, v))),
            }
        }
    }

    fn device(computation: f64, communication: f64) -> Py {
        Py::Dict(vec![
            ("computation", Py::Float(computation)),
            ("communication", Py::Float(communication)),
        ])
    }

    /// A pickled dict with integer keys in the order given, as Python writes FedScale's
    /// files.
    fn pickle(entries: &[(i64, Py)]) -> Vec<u8> {
        struct InOrder<'a>(&'a [(i64, Py)]);
        impl Serialize for InOrder<'_> {
            fn serialize<S: serde::Serializer>(
                &self,
                s: S,
            ) -> std::result::Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
            }
        }
        serde_pickle::to_vec(&InOrder(entries), SerOptions::new()).unwrap()
    }

    fn devices(bytes: &[u8], clients: usize) -> std::result::Result<Vec<Profile>, String> {
        parse_devices(Path::new("client_device_capacity"), bytes, clients)
            .map_err(|e| e.to_string())
    }

    fn behave(bytes: &[u8], clients: usize) -> std::result::Result<Vec<Activity>, String> {
        parse_behave(Path::new("client_behave_trace"), bytes, clients).map_err(|e| e.to_string())
    }

    #[test]
    fn devices_are_looked_up_by_key_client_plus_one_mod_entries() {
        // Keys 3, 1, 0, 2 (order does not matter for a lookup by key); key i holds a
        // device computing at 10·i + 1 ms a sample.
        let file =
            pickle(&[3, 1, 0, 2].map(|i| (i, device(10.0 * i as f64 + 1.0, 100.0 + i as f64))));
        let p = devices(&file, 6).unwrap();
        // Client k reads key (k + 1) mod 4: 1, 2, 3, 0, 1, 2.
        let keys: Vec<f64> = p
            .iter()
            .map(|d| (d.compute_ms_per_sample - 1.0) / 10.0)
            .collect();
        assert_eq!(keys, [1.0, 2.0, 3.0, 0.0, 1.0, 2.0]);
        assert_eq!(p[3].bandwidth_kbps, 100.0);
        // Integers are numbers too, as Python may write them.
        let ints = pickle(&[
            (0, device(1.0, 1.0)),
            (
                1,
                Py::Dict(vec![
                    ("computation", Py::Int(7)),
                    ("communication", Py::Int(9)),
                ]),
            ),
        ]);
        assert_eq!(
            devices(&ints, 1).unwrap(),
            [Profile {
                compute_ms_per_sample: 7.0,
                bandwidth_kbps: 9.0
            }]
        );
    }

    #[test]
    fn the_behave_trace_is_looked_up_by_position_in_the_files_order() {
        // Keys 10, 30, 20 in this order: client 0 reads position 1 (key 30), client 1
        // position 2 (key 20), client 2 position 0 (key 10).
        let entry = |start: f64| {
            Py::Dict(vec![
                ("active", Py::List(vec![start])),
                ("inactive", Py::List(vec![start + 1.0])),
                ("finish_time", Py::Int(100)),
                ("model", Py::Str("phone")),
            ])
        };
        let bytes = pickle(&[(10, entry(10.0)), (30, entry(30.0)), (20, entry(20.0))]);
        let a = behave(&bytes, 3).unwrap();
        for (k, start) in [(0, 30.0), (1, 20.0), (2, 10.0)] {
            assert!(
                a[k].is_active(start) && !a[k].is_active(start - 1.0),
                "client {k}"
            );
        }
    }

    #[test]
    fn a_malformed_file_names_the_file_the_client_and_the_key() {
        let good = device(1.0, 1.0);
        let second = |entry: Py| pickle(&[(0, good.clone()), (1, entry)]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"client,compute\n0,1\n".to_vec(), "not a pickled dict"),
            (
                serde_pickle::to_vec(&vec![1.0, 2.0], SerOptions::new()).unwrap(),
                "not a pickled dict",
            ),
            (pickle(&[]), "no client entries"),
            (
                second(Py::Dict(vec![("communication", Py::Float(5.0))])),
                "client 0 (the file's client 1): `computation` is missing",
            ),
            (
                second(Py::Dict(vec![("computation", Py::Float(5.0))])),
                "client 0 (the file's client 1): `communication` is missing",
            ),
            (
                second(device(f64::NAN, 5.0)),
                "client 0 (the file's client 1): `computation` is `NaN`",
            ),
            (
                second(device(2.0, 0.0)),
                "client 0 (the file's client 1): `communication` is `0`",
            ),
            (
                second(device(2.0, -3.0)),
                "client 0 (the file's client 1): `communication` is `-3`",
            ),
            (
                second(Py::Float(3.0)),
                "client 0 (the file's client 1): the entry is `3`",
            ),
            (
                pickle(&[(0, good.clone()), (2, good.clone())]),
                "client 0 (the file's client 1): no entry has the integer key 1",
            ),
        ];
        for (bytes, want) in cases {
            let e = devices(&bytes, 2).unwrap_err();
            assert!(e.contains("client_device_capacity"), "{e}");
            assert!(e.contains(want), "{e} lacks {want}");
        }
        let trace = |active: Py, finish: Py| {
            let entry = |active, finish| {
                Py::Dict(vec![
                    ("active", active),
                    ("inactive", Py::List(vec![1.0])),
                    ("finish_time", finish),
                ])
            };
            pickle(&[
                (5, entry(Py::List(vec![0.0]), Py::Float(10.0))),
                (7, entry(active, finish)),
            ])
        };
        let at_0 = || Py::List(vec![0.0]);
        for (bytes, want) in [
            (
                trace(at_0(), Py::Float(-1.0)),
                "client 0 (the file's client 7): `finish_time` is -1",
            ),
            (
                trace(at_0(), Py::Str("soon")),
                "client 0 (the file's client 7): `finish_time` is `\"soon\"`",
            ),
            (
                trace(Py::Float(0.0), Py::Float(10.0)),
                "client 0 (the file's client 7): `active` is `0`, not a list",
            ),
            (
                trace(Py::List(vec![4.0]), Py::Float(10.0)),
                "client 0 (the file's client 7): interval 0",
            ),
            (
                pickle(&[(5, Py::Dict(vec![("active", at_0())]))]),
                "client 0 (the file's client 5): `inactive` is missing",
            ),
        ] {
            let e = behave(&bytes, 2).unwrap_err();
            assert!(e.contains("client_behave_trace"), "{e}");
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }
}

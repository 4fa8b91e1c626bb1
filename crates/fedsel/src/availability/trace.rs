//! Availability replayed from a recorded trace, so that users can plug in real
//! device logs. The CSV has the header `round,client` and one row per active
//! (round, client) pair; clients are numbered as in the partition. Rounds past
//! the end of the trace repeat it cyclically.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Availability;
use crate::error::{ConfigError, DataError, Result, csv_with_header, read_file};
use crate::validate::check;

/// A recorded trace: a CSV with header `round,client`, one row per active pair;
/// rounds past its end repeat it cyclically. A relative path in a config file is
/// taken from that file's directory ([`anchor_paths`](crate::config::anchor_paths)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceConfig {
    /// The CSV file.
    pub trace: PathBuf,
}

impl TraceConfig {
    /// Rejects values no run can use, naming the key: this model's part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check(
            !self.trace.as_os_str().is_empty(),
            "availability.trace",
            "needs the path of a `round,client` CSV",
        )
    }
}

/// A trace loaded into memory.
///
/// Only the rounds the file lists are stored, so memory follows the file's size, not its
/// largest round number: one row for round 10⁹ must not allocate a billion rounds.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Active clients (sorted, distinct) of each round that has any.
    rounds: BTreeMap<usize, Vec<usize>>,
    /// Rounds in one cycle: the last round listed, plus one.
    cycle: usize,
}

impl Trace {
    /// Reads and checks a trace for `clients` clients.
    pub fn load(path: &Path, clients: usize) -> Result<Self> {
        Self::parse(path, &read_file(path)?, clients)
    }

    /// Parses and checks the CSV bytes of a trace for `clients` clients (`path` names
    /// them in errors).
    pub fn parse(path: &Path, bytes: &[u8], clients: usize) -> Result<Self> {
        let bad = |reason: String| DataError::corrupt(path, reason);
        let mut reader = csv_with_header(path, bytes, &["round", "client"])?;
        let mut rounds: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut cycle = 0;
        for (i, row) in reader.records().enumerate() {
            let line = i + 2;
            let row = row.map_err(|e| bad(format!("line {line}: {e}")))?;
            let field = |j: usize, name: &str| -> Result<usize, DataError> {
                row.get(j)
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or_else(|| {
                        bad(format!(
                            "line {line}: `{name}` is not a non-negative integer"
                        ))
                    })
            };
            let (t, k) = (field(0, "round")?, field(1, "client")?);
            if k >= clients {
                return Err(bad(format!(
                    "line {line}: client {k} does not exist (the partition has {clients} clients)"
                ))
                .into());
            }
            let end = t.checked_add(1).ok_or_else(|| {
                bad(format!(
                    "line {line}: round {t} is past the last round a run can have"
                ))
            })?;
            cycle = cycle.max(end);
            rounds.entry(t).or_default().push(k);
        }
        if rounds.is_empty() {
            return Err(bad("the trace has no rows".into()).into());
        }
        for r in rounds.values_mut() {
            r.sort_unstable();
            r.dedup();
        }
        Ok(Self { rounds, cycle })
    }

    /// Rounds in one cycle of the trace.
    pub fn len(&self) -> usize {
        self.cycle
    }

    /// Whether the trace has no rounds (never true for a loaded trace).
    pub fn is_empty(&self) -> bool {
        self.cycle == 0
    }
}

impl Availability for Trace {
    fn active(&self, t: usize) -> Vec<usize> {
        self.rounds
            .get(&(t % self.cycle))
            .cloned()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_replays_cyclically_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.csv");
        std::fs::write(&p, "round,client\n0,1\n0,0\n2,1\n").unwrap();
        let t = Trace::load(&p, 2).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t.active(0), vec![0, 1]);
        assert_eq!(t.active(1), Vec::<usize>::new());
        assert_eq!(t.active(5), vec![1]);
        assert_eq!(t.active(6), vec![0, 1]);
        let err = Trace::load(&p, 1).unwrap_err().to_string();
        assert!(err.contains("t.csv") && err.contains("line 2"), "{err}");
        std::fs::write(&p, "r,c\n0,1\n").unwrap();
        assert!(
            Trace::load(&p, 2)
                .unwrap_err()
                .to_string()
                .contains("header")
        );
        std::fs::write(&p, "round,client\n0,x\n").unwrap();
        assert!(
            Trace::load(&p, 2)
                .unwrap_err()
                .to_string()
                .contains("`client`")
        );
        let missing = Trace::load(&dir.path().join("none.csv"), 2).unwrap_err();
        assert!(missing.to_string().contains("none.csv"));
    }

    /// Found by the `trace` fuzz target (minimized): one row for a far round made the
    /// loader allocate every round up to it, and round `usize::MAX` overflowed.
    #[test]
    fn a_far_round_costs_one_row_and_the_last_usize_is_refused() {
        let path = Path::new("t.csv");
        let t = Trace::parse(path, b"round,client\n666666661,1", 2).unwrap();
        assert_eq!(t.len(), 666_666_662);
        assert_eq!(t.active(666_666_661), vec![1]);
        assert_eq!(t.active(5), Vec::<usize>::new());
        assert_eq!(t.active(666_666_662), Vec::<usize>::new());
        let last = format!("round,client\n{},0\n", usize::MAX);
        let err = Trace::parse(path, last.as_bytes(), 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("t.csv") && err.contains("line 2"), "{err}");
    }
}

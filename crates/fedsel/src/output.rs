//! Run outputs: `config.resolved.toml`, `metrics.csv`, `selections.csv`,
//! `availability.csv` (each round's available clients, space-separated), `summary.json`.
//!
//! Rows are flushed as each round ends, so a run that crashes or is killed
//! leaves every finished round readable. `summary.json` is written at the end,
//! or with `"status": "failed"` and the error when a run fails (`"interrupted"` when it
//! was asked to stop: Ctrl-C, SIGTERM).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::engine::{Observer, RoundRecord};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::summary::RunSummary;

/// Writes a run's files into one directory.
pub struct RunWriter {
    dir: PathBuf,
    metrics: csv::Writer<File>,
    selections: csv::Writer<File>,
    availability: csv::Writer<File>,
    /// TensorBoard event files, when `[output] tensorboard` names a directory.
    tensorboard: Option<crate::tensorboard::EventWriter>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Output {
        path: path.to_path_buf(),
        error: source,
    }
}

fn csv_err(path: &Path) -> impl FnOnce(csv::Error) -> Error + '_ {
    move |e| Error::Output {
        path: path.to_path_buf(),
        error: std::io::Error::other(e),
    }
}

/// The per-client accuracy columns, appended after those of earlier releases.
pub const CLIENT_ACC_COLUMNS: [&str; 4] = [
    "client_acc_p10",
    "client_acc_p50",
    "client_acc_p90",
    "client_acc_worst10",
];

/// The columns of `metrics.csv`.
pub fn metric_columns() -> Vec<&'static str> {
    let mut c = vec![
        "round",
        "test_acc",
        "test_loss",
        "train_loss",
        "n_selected",
        "n_available",
        "budget",
        "lr",
    ];
    c.extend(Ledger::COLUMNS);
    c.push("elapsed_s");
    c.extend(CLIENT_ACC_COLUMNS);
    c
}

/// The columns `metrics.csv` appends when `[system]` runs a virtual clock: the trainings the
/// round policy wasted (the ledger's `wasted_trainings`), the round's virtual seconds and
/// the clock at its end. Without a clock they are absent, so such runs write the bytes they
/// always did.
pub const CLOCK_COLUMNS: [&str; 3] = ["wasted_trainings", "round_s", "clock_s"];

/// The columns `metrics.csv` appends after [`CLOCK_COLUMNS`] under `[system.stale]` or
/// `system.round.policy = "fedbuff"`: the round's aggregated updates of staleness ≥ 1 (late
/// updates folded; buffered updates trained from an older model), their mean staleness
/// (empty when none), and the late trainings folded (the ledger's `stale_trainings`).
pub const STALE_COLUMNS: [&str; 3] = ["stale_updates", "mean_staleness", "stale_trainings"];

/// Whether a run's `metrics.csv` has [`STALE_COLUMNS`].
fn has_stale_columns(config: &Config) -> bool {
    config.system.as_ref().is_some_and(|s| {
        s.is_on()
            && (s.stale.is_some() || matches!(s.round, crate::system::RoundPolicy::Fedbuff { .. }))
    })
}

impl RunWriter {
    /// Creates `dir` and writes the resolved config and the CSV headers. A directory that
    /// already holds anything is refused ([`Error::RunExists`]): a finished run is never
    /// overwritten by accident, and no file of an earlier run stays beside a new one.
    pub fn create(dir: &Path, config: &Config) -> Result<Self> {
        if failed_before_round_one(dir) {
            // Not a run: nothing in it is a result, so a corrected rerun takes its place.
            std::fs::remove_dir_all(dir).map_err(io(dir))?;
        } else if std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()) {
            return Err(Error::RunExists {
                dir: dir.to_path_buf(),
            });
        }
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let cfg_path = dir.join("config.resolved.toml");
        std::fs::write(&cfg_path, config.to_resolved_toml()).map_err(io(&cfg_path))?;
        let new = |name: &str, header: &[&str]| -> Result<csv::Writer<File>> {
            let path = dir.join(name);
            let mut w = csv::Writer::from_path(&path).map_err(csv_err(&path))?;
            w.write_record(header).map_err(csv_err(&path))?;
            w.flush().map_err(io(&path))?;
            Ok(w)
        };
        Self {
            dir: dir.to_path_buf(),
            metrics: new("metrics.csv", &{
                let mut c = metric_columns();
                if config.system.as_ref().is_some_and(|s| s.is_on()) {
                    c.extend(CLOCK_COLUMNS);
                }
                if has_stale_columns(config) {
                    c.extend(STALE_COLUMNS);
                }
                c
            })?,
            selections: new("selections.csv", &["round", "client"])?,
            availability: new("availability.csv", &["round", "available"])?,
            tensorboard: None,
        }
        .with_trackers(config)
    }

    /// Opens the trackers `config`'s `[output]` section asks for (a new event file in the
    /// TensorBoard directory). [`RunWriter::create`] does; a resumed run calls it after
    /// [`RunWriter::resume`].
    pub fn with_trackers(mut self, config: &Config) -> Result<Self> {
        if let Some(dir) = &config.output.tensorboard {
            self.tensorboard = Some(crate::tensorboard::EventWriter::create(
                dir,
                &config.to_resolved_toml(),
            )?);
        }
        Ok(self)
    }

    /// Reopens the files of an interrupted run whose checkpoint resumes at `next_round`:
    /// rows of rounds at or after it (written after the checkpoint) are dropped, since
    /// the resumed run writes them again.
    pub fn resume(dir: &Path, next_round: usize) -> Result<Self> {
        let open = |name: &str| -> Result<csv::Writer<File>> {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path).map_err(io(&path))?;
            let mut kept = String::with_capacity(text.len());
            // A run begun by an earlier release lacks the columns appended since: its header
            // gains them and its rows empty fields, so every row has the header's width.
            let header = metric_columns().join(",");
            let missing = match text.lines().next() {
                Some(old) if name == "metrics.csv" && old != header => header
                    .strip_prefix(old)
                    .filter(|rest| rest.starts_with(','))
                    .map_or(0, |rest| rest.matches(',').count()),
                _ => 0,
            };
            for (i, line) in text.lines().enumerate() {
                let round = line.split(',').next().and_then(|r| r.parse::<usize>().ok());
                if i == 0 && missing > 0 {
                    kept.push_str(&header);
                    kept.push('\n');
                } else if i == 0 || round.is_some_and(|r| r < next_round) {
                    kept.push_str(line);
                    kept.push_str(&",".repeat(missing));
                    kept.push('\n');
                }
            }
            let tmp = dir.join(format!("{name}.tmp"));
            std::fs::write(&tmp, kept).map_err(io(&tmp))?;
            std::fs::rename(&tmp, &path).map_err(io(&path))?;
            let f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io(&path))?;
            Ok(csv::WriterBuilder::new().has_headers(false).from_writer(f))
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            metrics: open("metrics.csv")?,
            selections: open("selections.csv")?,
            availability: open("availability.csv")?,
            tensorboard: None,
        })
    }

    /// Writes `summary.json` for a finished run.
    pub fn finish(&self, summary: &RunSummary) -> Result<()> {
        let mut v = serde_json::to_value(summary).expect("summary serializes");
        v["status"] = "finished".into();
        self.write_summary(&v)
    }

    /// Writes `summary.json` for a failed or interrupted run, with the error.
    pub fn fail(&self, error: &Error, rounds_done: usize) -> Result<()> {
        let status = match error {
            Error::Interrupted { .. } => "interrupted",
            _ => "failed",
        };
        let v = serde_json::json!({
            "status": status,
            "error": error.to_string(),
            "rounds_completed": rounds_done,
            "version": crate::VERSION,
        });
        self.write_summary(&v)
    }

    fn write_summary(&self, v: &serde_json::Value) -> Result<()> {
        let path = self.dir.join("summary.json");
        let tmp = self.dir.join("summary.json.tmp");
        let mut f = File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(serde_json::to_string_pretty(v).expect("json").as_bytes())
            .map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))
    }
}

/// Whether `dir` holds a run that failed before finishing any round (its summary says
/// so and no metrics row follows the header): the only state that [`RunWriter::create`]
/// replaces rather than refuses.
pub fn failed_before_round_one(dir: &Path) -> bool {
    let failed = std::fs::read_to_string(dir.join("summary.json"))
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .is_some_and(|v| v["status"] == "failed" && v["rounds_completed"] == 0);
    let rows = std::fs::read_to_string(dir.join("metrics.csv"))
        .map_or(0, |m| m.lines().count().saturating_sub(1));
    failed && rows == 0
}

/// A round's `metrics.csv` values by column, in the file's order, `None` for an empty
/// cell; the clock's columns are there when the round ran on a virtual clock. The values
/// trackers see (TensorBoard, Python's `on_round`).
pub fn metric_values(r: &RoundRecord) -> Vec<(&'static str, Option<f64>)> {
    let spread = r.client_acc.map(|c| [c.p10, c.p50, c.p90, c.worst10]);
    let mut v: Vec<Option<f64>> = vec![
        Some(r.round as f64),
        r.test_acc,
        r.test_loss,
        Some(r.train_loss),
        Some(r.n_selected as f64),
        Some(r.n_available as f64),
        Some(r.budget as f64),
        Some(r.lr),
    ];
    v.extend(r.cost.values().iter().map(|&c| Some(c as f64)));
    v.push(Some(r.elapsed_s));
    v.extend((0..CLIENT_ACC_COLUMNS.len()).map(|i| spread.map(|s| s[i])));
    let mut columns = metric_columns();
    if let Some(c) = &r.clock {
        columns.extend(CLOCK_COLUMNS);
        v.extend([
            Some(r.cost.wasted_trainings as f64),
            Some(c.round_s),
            Some(c.clock_s),
        ]);
        if let Some((n, mean)) = c.stale {
            columns.extend(STALE_COLUMNS);
            v.extend([
                Some(n as f64),
                (n > 0).then_some(mean),
                Some(r.cost.stale_trainings as f64),
            ]);
        }
    }
    debug_assert_eq!(columns.len(), v.len());
    columns.into_iter().zip(v).collect()
}

/// A time as it is, to the last bit: the shortest decimal that reads back to the same
/// f64, in exponent form outside [10⁻⁴, 10¹⁵) so that no magnitude prints as a row of
/// zeros or hundreds of digits (six decimals printed a fast device's round as 0.000000).
fn exact(x: f64) -> String {
    if x == 0.0 || (1e-4..1e15).contains(&x.abs()) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

fn opt(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.6}")).unwrap_or_default()
}

impl Observer for RunWriter {
    fn on_reports(&mut self, files: &[(String, String)]) -> Result<()> {
        for (name, text) in files {
            let path = self.dir.join(name);
            std::fs::write(&path, text).map_err(io(&path))?;
        }
        Ok(())
    }

    fn on_checkpoint(&mut self, checkpoint: &crate::checkpoint::Checkpoint) -> Result<()> {
        crate::checkpoint::save(&self.dir, checkpoint)
    }

    fn on_round(&mut self, r: &RoundRecord) -> Result<()> {
        let mut row = vec![
            r.round.to_string(),
            opt(r.test_acc),
            opt(r.test_loss),
            format!("{:.6}", r.train_loss),
            r.n_selected.to_string(),
            r.n_available.to_string(),
            r.budget.to_string(),
            format!("{:e}", r.lr),
        ];
        row.extend(r.cost.values().iter().map(u64::to_string));
        row.push(format!("{:.3}", r.elapsed_s));
        let spread = r.client_acc.map(|c| [c.p10, c.p50, c.p90, c.worst10]);
        row.extend((0..CLIENT_ACC_COLUMNS.len()).map(|i| opt(spread.map(|s| s[i]))));
        if let Some(c) = &r.clock {
            row.extend([
                r.cost.wasted_trainings.to_string(),
                exact(c.round_s),
                exact(c.clock_s),
            ]);
            if let Some((n, mean)) = c.stale {
                row.extend([
                    n.to_string(),
                    if n == 0 {
                        String::new()
                    } else {
                        format!("{mean:.6}")
                    },
                    r.cost.stale_trainings.to_string(),
                ]);
            }
        }
        let mpath = self.dir.join("metrics.csv");
        self.metrics.write_record(&row).map_err(csv_err(&mpath))?;
        self.metrics.flush().map_err(io(&mpath))?;
        let spath = self.dir.join("selections.csv");
        for k in &r.selected {
            self.selections
                .write_record([r.round.to_string(), k.to_string()])
                .map_err(csv_err(&spath))?;
        }
        self.selections.flush().map_err(io(&spath))?;
        let apath = self.dir.join("availability.csv");
        self.availability
            .write_record([r.round.to_string(), id_ranges(&r.available)])
            .map_err(csv_err(&apath))?;
        self.availability.flush().map_err(io(&apath))?;
        if let Some(tb) = &mut self.tensorboard {
            tb.on_round(r, &metric_values(r));
        }
        Ok(())
    }
}

/// Ascending client ids as space-separated runs, `a-b` for the consecutive ids a to b and
/// `k` for a lone one: a round where 100,000 clients are available is `0-99999`, where the
/// plain list took 590 KB a round.
pub fn id_ranges(ids: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&ids[i].to_string());
        if j > i {
            out.push('-');
            out.push_str(&ids[j].to_string());
        }
        i = j + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clock columns keep every bit at any magnitude: a microsecond round is not 0.000000,
    /// a century not a row of digits, and each reads back to the same f64.
    #[test]
    fn clock_times_are_written_exactly() {
        for (x, text) in [
            (0.0, "0"),
            (53.123_456_789, "53.123456789"),
            (4.2e-7, "4.2e-7"),
            (1.844_674_407_370_955_2e19, "1.8446744073709552e19"),
            (0.1 + 0.2, "0.30000000000000004"),
        ] {
            assert_eq!(exact(x), text);
            assert_eq!(text.parse::<f64>().unwrap(), x);
        }
    }

    #[test]
    fn ids_are_written_as_runs() {
        assert_eq!(id_ranges(&[]), "");
        assert_eq!(id_ranges(&[4]), "4");
        assert_eq!(id_ranges(&[0, 1, 2, 5, 7, 8]), "0-2 5 7-8");
        let all: Vec<usize> = (0..100_000).collect();
        assert_eq!(id_ranges(&all), "0-99999");
    }

    /// A run begun before the per-client accuracy columns existed resumes with them: the
    /// header gains them, the kept rows gain empty fields, and the rows of rounds after the
    /// checkpoint go.
    #[test]
    fn resuming_an_older_run_widens_its_metrics() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        drop(RunWriter::create(&dir, &Config::default()).unwrap());
        let old: Vec<&str> = metric_columns()[..metric_columns().len() - 4].to_vec();
        let row = |t: usize| format!("{t}{}", ",1".repeat(old.len() - 1));
        let text = format!("{}\n{}\n{}\n{}\n", old.join(","), row(0), row(1), row(2));
        std::fs::write(dir.join("metrics.csv"), text).unwrap();
        drop(RunWriter::resume(&dir, 2).unwrap());
        let back = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
        let lines: Vec<&str> = back.lines().collect();
        assert_eq!(lines[0], metric_columns().join(","));
        assert_eq!(lines[1..], [row(0) + ",,,,", row(1) + ",,,,"]);
    }

    /// Only a run that failed before finishing a round is replaced; one with a finished
    /// round, or any other content, is refused.
    #[test]
    fn only_a_run_failed_at_round_zero_is_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let config = Config::default();
        let dir = tmp.path().join("run");
        let failed = |rows: usize| {
            let w = RunWriter::create(&dir, &config).unwrap();
            let header = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
            std::fs::write(dir.join("metrics.csv"), header + &"0,0.1\n".repeat(rows)).unwrap();
            w.fail(
                &Error::Selection {
                    selector: "x".into(),
                    round: rows,
                    reason: "y".into(),
                },
                rows,
            )
            .unwrap();
        };
        failed(0);
        assert!(failed_before_round_one(&dir));
        std::fs::write(dir.join("marker"), "").unwrap();
        RunWriter::create(&dir, &config).unwrap();
        assert!(!dir.join("marker").exists(), "the failed run was replaced");
        std::fs::remove_dir_all(&dir).unwrap();
        failed(1);
        assert!(!failed_before_round_one(&dir));
        assert!(matches!(
            RunWriter::create(&dir, &config),
            Err(Error::RunExists { .. })
        ));
    }
}

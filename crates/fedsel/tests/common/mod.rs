//! Helpers shared by the integration tests.

use std::path::PathBuf;

use fedsel::config::Config;
use fedsel::data::locate;
use fedsel::engine::{self, Experiment, Observer, RoundRecord};
use fedsel::error::Error;
use fedsel::output::RunWriter;

/// `../shared/data` beside the repository, if present.
pub fn shared_data() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    if p.join("fashion-mnist").is_dir() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: ../shared/data not found at {}; data-dependent checks skipped",
            p.display()
        );
        None
    }
}

/// Collects every round in memory.
#[derive(Default)]
pub struct Collect(pub Vec<RoundRecord>);

impl Observer for Collect {
    fn on_round(&mut self, r: &RoundRecord) -> fedsel::error::Result<()> {
        self.0.push(r.clone());
        Ok(())
    }
}

/// The built-in synthetic experiment with `overrides` (`key=value`, as `--set` takes them).
pub fn synthetic(overrides: &[&str]) -> Experiment {
    let set: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    let config = Config::load(None, &set).unwrap();
    config.validate().unwrap();
    let dir = locate::data_dir(None, None);
    Experiment::prepare(config, &dir).unwrap()
}

/// Every round's record of a run of `exp`.
pub fn run(exp: &Experiment) -> Vec<RoundRecord> {
    let mut c = Collect::default();
    engine::run(exp, &mut c).unwrap();
    c.0
}

/// Writes like a run, then "crashes" (returns an error) after a given round.
pub struct CrashAfter {
    pub writer: RunWriter,
    pub round: usize,
}

impl engine::Observer for CrashAfter {
    fn on_round(&mut self, r: &RoundRecord) -> fedsel::error::Result<()> {
        self.writer.on_round(r)?;
        if r.round == self.round {
            return Err(Error::Selection {
                selector: "test".into(),
                round: r.round,
                reason: "simulated crash".into(),
            });
        }
        Ok(())
    }
    fn on_checkpoint(&mut self, cp: &fedsel::checkpoint::Checkpoint) -> fedsel::error::Result<()> {
        self.writer.on_checkpoint(cp)
    }
}

/// A run of `exp` whole, and the same run crashed after round `crash`, then resumed from its
/// last checkpoint, which must resume at `next_round`.
pub struct Resumed {
    pub whole: tempfile::TempDir,
    pub broken: tempfile::TempDir,
    pub full: fedsel::summary::RunSummary,
    pub resumed: fedsel::summary::RunSummary,
    /// The checkpoint the resume started from.
    pub checkpoint: fedsel::checkpoint::Checkpoint,
}

impl Resumed {
    pub fn run(exp: &Experiment, crash: usize, next_round: usize) -> Self {
        let whole = tempfile::tempdir().unwrap();
        let mut w = RunWriter::create(whole.path(), &exp.config).unwrap();
        let full = engine::run(exp, &mut w).unwrap();
        let broken = tempfile::tempdir().unwrap();
        let mut crashing = CrashAfter {
            writer: RunWriter::create(broken.path(), &exp.config).unwrap(),
            round: crash,
        };
        assert!(engine::run(exp, &mut crashing).is_err());
        let checkpoint = fedsel::checkpoint::load(broken.path()).unwrap();
        assert_eq!(
            checkpoint.next_round, next_round,
            "the last checkpoint before the crash"
        );
        let mut w = RunWriter::resume(broken.path(), next_round).unwrap();
        let resumed = engine::resume(exp, &mut w, checkpoint.clone()).unwrap();
        Self {
            whole,
            broken,
            full,
            resumed,
            checkpoint,
        }
    }

    /// The resumed run's metrics (but for wall time) and selections are the whole run's.
    pub fn assert_same(&self, what: &str) {
        assert_eq!(
            metrics_without_time(self.whole.path()),
            metrics_without_time(self.broken.path()),
            "{what}"
        );
        let selections = |d: &tempfile::TempDir| {
            std::fs::read_to_string(d.path().join("selections.csv")).unwrap()
        };
        assert_eq!(selections(&self.whole), selections(&self.broken), "{what}");
    }
}

pub fn metrics_without_time(dir: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
    let time = text
        .lines()
        .next()
        .unwrap()
        .split(',')
        .position(|c| c == "elapsed_s")
        .unwrap();
    text.lines()
        .map(|l| {
            let mut fields: Vec<&str> = l.split(',').collect();
            fields.remove(time);
            fields.join(",")
        })
        .collect()
}

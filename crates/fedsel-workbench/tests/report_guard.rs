//! `fedsel report RUN_DIR...` compares only what can be compared: hand-made run directories
//! of two tasks are refused unless allowed, and a run cut short is left out and named.

use std::path::{Path, PathBuf};

use fedsel_workbench::error::Error;
use fedsel_workbench::report::{self, Format};

/// The task of a run: dataset, number of clients, model and target.
struct Task {
    dataset: &'static str,
    clients: usize,
    model: &'static str,
    target: f64,
}

const FMNIST: Task = Task {
    dataset: "fmnist",
    clients: 100,
    model: "cnn",
    target: 0.69,
};

const SYNTHETIC: Task = Task {
    dataset: "synthetic",
    clients: 30,
    model: "mlr",
    target: 0.5,
};

const ROUNDS: usize = 4;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A finished run directory of `ROUNDS` rounds, as `fedsel run` writes it, whose accuracy
/// climbs by 0.1 a round from `start`.
fn run(root: &Path, task: &Task, strategy: &str, seed: u64, start: f64) -> PathBuf {
    let dir = root.join(format!("{}-{strategy}-{seed}", task.dataset));
    write(
        &dir.join("config.resolved.toml"),
        &format!(
            "name = \"{strategy}\"\nseed = {seed}\nrounds = {ROUNDS}\ntargets = [{}]\n[dataset]\nkind = \"{}\"\n[partition]\nclients = {}\nholdout_fraction = 0.2\n[partition.scheme]\nkind = \"iid\"\n[model]\nkind = \"{}\"\n[selection]\nstrategy = \"{strategy}\"\n[train]\nlr = 0.05\n",
            task.target, task.dataset, task.clients, task.model
        ),
    );
    let acc: Vec<f64> = (0..ROUNDS).map(|i| start + 0.1 * i as f64).collect();
    let mut metrics = String::from("round,test_acc,test_loss,train_loss\n");
    for (i, a) in acc.iter().enumerate() {
        metrics.push_str(&format!("{i},{a},{},1.0\n", 2.0 - a));
    }
    write(&dir.join("metrics.csv"), &metrics);
    write(
        &dir.join("selections.csv"),
        "round,client\n0,0\n1,1\n2,0\n3,2\n",
    );
    write(
        &dir.join("availability.csv"),
        "round,available\n0,0 1 2\n1,0 1 2\n2,0 1 2\n3,0 1 2\n",
    );
    let reached = acc.iter().position(|a| *a >= task.target).map(|i| i + 1);
    let last = acc[ROUNDS - 1];
    let summary = serde_json::json!({
        "status": "finished", "strategy": strategy, "seed": seed, "rounds": ROUNDS,
        "final_acc": last, "final_loss": 2.0 - last, "best_acc": last, "best_loss": 2.0 - last,
        "rounds_to_target": [[task.target, reached]],
        "cost": {
            "broadcasts": 12, "uploads": 12, "trainings": 12, "extra_trainings": 0,
            "probe_trainings": 0, "train_steps": 120, "evaluations": 0,
            "eval_examples": 0, "scalar_reports": 0, "gradients": 0,
            "gradient_examples": 0, "protocol_messages": 0
        },
    });
    write(&dir.join("summary.json"), &summary.to_string());
    dir
}

/// A FedCor FMNIST arm and a Synthetic arm: refused, naming every task key that differs
/// with its values (and no key that is not the task's, such as the strategy); allowed, the
/// report says what differs and numbers the target columns, each row naming its target.
#[test]
fn runs_of_two_tasks_are_refused_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = [1, 2]
        .into_iter()
        .flat_map(|seed| {
            [
                run(tmp.path(), &FMNIST, "fedcor", seed, 0.5),
                run(tmp.path(), &SYNTHETIC, "uniform", seed, 0.3),
            ]
        })
        .collect();
    let out = tmp.path().join("cmp");
    let err = report::report(&dirs, Some(&out), None, Format::Markdown, false).unwrap_err();
    let Error::MixedTasks { differences } = &err else {
        panic!("{err}")
    };
    let named: Vec<(&str, Vec<&str>)> = differences
        .iter()
        .map(|d| {
            let values = d.values.iter().map(|v| v.0.as_str()).collect();
            (d.key.as_str(), values)
        })
        .collect();
    assert_eq!(
        named,
        [
            ("dataset.kind", vec!["fmnist", "synthetic"]),
            ("model.kind", vec!["cnn", "mlr"]),
            ("partition.clients", vec!["100", "30"]),
            ("targets", vec!["[0.69]", "[0.5]"]),
        ]
    );
    assert!(
        differences.iter().all(|d| d.values[0].1 == dirs[0]),
        "{err}"
    );
    assert!(!out.exists(), "a refused comparison writes nothing");
    let (file, md) = report::report(&dirs, Some(&out), None, Format::Markdown, true).unwrap();
    assert_eq!(file, out.join("report.md"));
    assert!(
        md.contains("**The arms are of different tasks, compared side by side as asked:** `dataset.kind` is fmnist (`"),
        "{md}"
    );
    assert!(
        md.contains("| target 1 |") && md.contains("| targets |"),
        "{md}"
    );
    let row = md
        .lines()
        .find(|l| l.starts_with("| all | strategy=uniform, dataset.kind=synthetic"))
        .unwrap();
    assert!(row.ends_with("| 50% |"), "{row}");
}

/// One seed of an arm whose `metrics.csv` was cut to half its rounds, and one without its
/// summary, are left out: named with the reason in the report, the arm reported with the
/// seeds that are whole.
#[test]
fn a_truncated_run_is_named_and_left_out() {
    let tmp = tempfile::tempdir().unwrap();
    let mut dirs: Vec<PathBuf> = (1..=3)
        .flat_map(|seed| {
            [
                run(tmp.path(), &SYNTHETIC, "uniform", seed, 0.2),
                run(tmp.path(), &SYNTHETIC, "oort", seed, 0.3),
            ]
        })
        .collect();
    let cut = dirs[1].clone();
    let metrics = std::fs::read_to_string(cut.join("metrics.csv")).unwrap();
    let half: Vec<&str> = metrics.lines().take(1 + ROUNDS / 2).collect();
    std::fs::write(cut.join("metrics.csv"), half.join("\n") + "\n").unwrap();
    let unfinished = run(tmp.path(), &SYNTHETIC, "oort", 4, 0.3);
    std::fs::remove_file(unfinished.join("summary.json")).unwrap();
    dirs.push(unfinished.clone());
    let out = tmp.path().join("cmp");
    let (_, md) = report::report(&dirs, Some(&out), None, Format::Markdown, false).unwrap();
    assert!(md.starts_with("# Report: 5 runs in 2 arms"), "{md}");
    assert!(
        md.contains("**Runs left out, not being whole (2):**"),
        "{md}"
    );
    assert!(
        md.contains(&format!(
            "- `{}`: truncated: metrics.csv holds 2 of the 4 rounds in summary.json",
            cut.display()
        )),
        "{md}"
    );
    assert!(
        md.contains(&format!(
            "- `{}`: truncated: it has no summary.json",
            unfinished.display()
        )),
        "{md}"
    );
    assert!(md.contains("| all | strategy=oort | 2 |"), "{md}");
    assert!(md.contains("| all | strategy=uniform | 3 |"), "{md}");
    let left = [cut, unfinished];
    let err = report::report(&left, Some(&out), None, Format::Markdown, false).unwrap_err();
    assert!(
        matches!(&err, Error::NothingLeft { left_out } if left_out.len() == 2),
        "{err}"
    );
}

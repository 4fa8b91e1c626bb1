//! OCS runs through fedsel's engine like a built-in strategy: its own weights aggregate the
//! round, its norm queries are booked as probe trainings of every available client, and
//! a run through the registered CLI writes its outputs.

use std::process::Command;

#[test]
fn ocs_runs_through_the_cli_with_its_queries_in_the_ledger() {
    let dir = std::env::temp_dir().join(format!("fedsel-ocs-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_fedsel-ocs"))
        .args([
            "run",
            "--set",
            "rounds=4",
            "--set",
            "selection.strategy=\"ocs\"",
            "--out",
        ])
        .arg(&dir)
        .output()
        .expect("fedsel-ocs runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let summary = std::fs::read_to_string(dir.join("summary.json")).unwrap();
    assert!(summary.contains("\"strategy\": \"ocs\""), "{summary}");
    // Every one of the 30 always-available clients computes its update for the norms,
    // every round.
    assert!(summary.contains("\"probe_trainings\": 120"), "{summary}");
    let config = std::fs::read_to_string(dir.join("config.resolved.toml")).unwrap();
    assert!(config.contains("aggregation = \"selector\""), "{config}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_plain_binary_does_not_know_ocs() {
    // Without registration the name is refused, listing the strategies there are.
    let e = fedsel::config::Config::load(None, &["selection.strategy=\"ocs\"".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`ocs`") && e.contains("uniform"), "{e}");
}

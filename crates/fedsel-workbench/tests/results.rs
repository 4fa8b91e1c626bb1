//! `fedsel results`: collecting a sweep's rows, rendering the page's blocks, and the check
//! that fails when the page or the code moved on without the CSVs.

use std::path::Path;
use std::process::Command;

use fedsel::config::Config;
use fedsel_workbench::results::{self, CollectArgs};

/// A finished sweep cell of `strategy` and `seed` with a final accuracy and rounds to the
/// target 0.6 (`None`: never reached in its 40 rounds).
fn cell(
    sweep: &Path,
    strategy: &str,
    seed: u64,
    acc: f64,
    rounds: Option<u64>,
) -> serde_json::Value {
    let mut config = Config {
        seed,
        ..Config::default()
    };
    // As loading does before a sweep hashes and writes a cell's config.
    config.resolve();
    let dir_name = format!("{strategy}-s{seed}");
    let dir = sweep.join("cells").join(&dir_name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.resolved.toml"), config.to_resolved_toml()).unwrap();
    let summary = serde_json::json!({
        "status": "finished", "seed": seed, "rounds": 40, "final_acc": acc,
        "rounds_to_target": [[0.6, rounds]],
    });
    std::fs::write(dir.join("summary.json"), summary.to_string()).unwrap();
    serde_json::json!({ "dir": dir_name, "label": dir_name, "strategy": strategy, "seed": seed, "setting": "all", "targets": [0.6] })
}

fn args(metric: &str, commit: &str) -> CollectArgs {
    CollectArgs {
        section: "demo".into(),
        table: "T1".into(),
        metric: metric.into(),
        target: None,
        command: "fedsel sweep demo.toml --out runs/demo".into(),
        commit: commit.into(),
        unplanned: vec!["powd".into()],
    }
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn collect_render_and_check_round_trip_and_catch_drift() {
    let repo = tempfile::tempdir().unwrap();
    let root = repo.path();
    git(root, &["init", "-q"]);
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("src/select.rs"), "v1\n").unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "one"]);
    let commit = git(root, &["rev-parse", "HEAD"]).trim().to_string();

    let sweep = root.join("sweep");
    let mut cells = Vec::new();
    let accs = [0.70, 0.72, 0.74, 0.76, 0.78];
    for (i, acc) in accs.iter().enumerate() {
        let seed = i as u64 + 1;
        cells.push(cell(&sweep, "uniform", seed, *acc, Some(10 + seed)));
        cells.push(cell(
            &sweep,
            "powd",
            seed,
            acc + 0.01,
            (seed != 3).then_some(seed),
        ));
    }
    // A cell still running: left out and named.
    std::fs::create_dir_all(sweep.join("cells/md-s1")).unwrap();
    cells.push(serde_json::json!({ "dir": "md-s1", "label": "md-s1", "strategy": "md", "seed": 1, "setting": "all", "targets": [0.6] }));
    std::fs::write(
        sweep.join("sweep.json"),
        serde_json::json!({ "name": "demo", "baseline": "uniform", "cells": cells }).to_string(),
    )
    .unwrap();

    let res = root.join("results");
    let c = results::collect(&sweep, &res, &args("final_acc", &commit)).unwrap();
    assert_eq!(
        (c.added, c.unfinished.clone()),
        (10, vec!["md-s1".to_string()])
    );
    results::collect(&sweep, &res, &args("rounds_to_target", &commit)).unwrap();
    // The same (cell, seed) twice is refused, naming it.
    let err = results::collect(&sweep, &res, &args("final_acc", &commit)).unwrap_err();
    assert!(
        err.to_string().contains("already holds seed 1 of T1 / all"),
        "{err}"
    );
    let err = results::collect(&sweep, &res, &args("accuracy", &commit)).unwrap_err();
    assert!(err.to_string().contains("--metric"), "{err}");

    let data = results::load(&res).unwrap();
    assert_eq!(data.rows.len(), 20);
    let r = data
        .rows
        .iter()
        .find(|r| r.method == "powd" && r.seed == 3 && r.metric == "rounds_to_target")
        .unwrap();
    assert!(r.censored && r.value == 40.0 && !r.planned);
    let mut config = Config {
        seed: 1,
        ..Config::default()
    };
    config.resolve();
    assert_eq!(data.rows[0].config_hash, config.hash());

    // Paper: uniform final_acc 0.74 ± 0.05 agrees (ours: s = 0.0316, [0.7007, 0.7793] inside
    // [0.69, 0.79]);
    // uniform rounds 30 ± 2 differs (ours 13 [11.0, 15.0]); a planned cell never run.
    std::fs::write(
        res.join("paper.csv"),
        "section,table,setting,method,metric,mean,std,n,source\n\
         demo,T1,all,uniform,final_acc,0.74,0.05,5,p. 1\n\
         demo,T1,all,uniform,rounds_to_target,30,2,5,p. 1\n\
         demo,T1,all,divfl,final_acc,0.6,,,p. 1\n",
    )
    .unwrap();
    std::fs::write(
        res.join("sections.toml"),
        "[demo]\npaths = [\"src/select.rs\"]\n",
    )
    .unwrap();
    let doc = root.join("page.md");
    std::fs::write(
        &doc,
        "# Page\n\n<!-- results:demo begin -->\nstale\n<!-- results:demo end -->\n\nAfter.\n",
    )
    .unwrap();
    assert_eq!(results::check(&res, &doc).unwrap().len(), 1);
    let r = results::render_doc(&res, &doc).unwrap();
    assert_eq!((r.updated, r.appended), (vec!["demo".to_string()], vec![]));
    let page = std::fs::read_to_string(&doc).unwrap();
    assert!(
        page.starts_with("# Page\n\n<!-- results:demo begin -->\n_Generated"),
        "{page}"
    );
    assert!(
        page.ends_with("<!-- results:demo end -->\n\nAfter.\n"),
        "{page}"
    );
    assert!(
        page.contains("1 agrees, 1 differs, 0 inconclusive, 0 too few seeds, 0 censored, 0 no margin, 0 no paper value, 1 not run, of 3 planned cells"),
        "{page}"
    );
    // The unplanned arm is shown, with its censored seed (1 + 2 + 40 + 4 + 5 over 5), but
    // not counted.
    assert!(
        page.contains(
            "| T1 | all | powd | rounds_to_target | 5 | ≥ 10.4 (1 of 5 censored at 40.0) |"
        ),
        "{page}"
    );
    assert!(page.contains("| T1 | all | uniform | rounds_to_target | 5 | 13.0 [11.0, 15.0] | 30.0 ± 2.0, 5 seeds | 2.0 (paper's std) | differs |"), "{page}");
    assert_eq!(results::check(&res, &doc).unwrap(), Vec::<String>::new());

    // A hand edit of the block fails the check.
    std::fs::write(&doc, page.replace("1 agrees", "2 agrees")).unwrap();
    let p = results::check(&res, &doc).unwrap();
    assert!(p.len() == 1 && p[0].contains("no longer matches"), "{p:?}");
    std::fs::write(&doc, &page).unwrap();

    // The code path changes after the rows' commit: stale until a note explains it.
    std::fs::write(root.join("src/select.rs"), "v2\n").unwrap();
    git(root, &["commit", "-qam", "two"]);
    let p = results::check(&res, &doc).unwrap();
    assert!(
        p.len() == 1 && p[0].contains("code paths changed after commit"),
        "{p:?}"
    );
    std::fs::write(
        res.join("sections.toml"),
        "[demo]\npaths = [\"src/select.rs\"]\nnotes = \"two only renames a variable\"\n",
    )
    .unwrap();
    assert_eq!(results::check(&res, &doc).unwrap(), Vec::<String>::new());
}

#[test]
fn the_committed_example_matches_its_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results/example");
    let data = results::load(&root).unwrap();
    assert_eq!(data.rows.len(), 45);
    let page = std::fs::read_to_string(root.join("results.md")).unwrap();
    let body = results::render(&data).remove("example").unwrap();
    assert!(
        page.contains(&body),
        "rerun `fedsel results render --results results/example --doc results/example/results.md`"
    );
}

//! `fedsel results`: collecting a sweep's rows, rendering the page's blocks, and the check
//! that fails when the page or the code moved on without the CSVs.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use fedsel::config::Config;
use fedsel_workbench::results::registration::History;
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
        commit: Some(commit.into()),
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
    assert_eq!(results::check(&res, &doc).unwrap().problems.len(), 1);
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
    assert_eq!(
        results::check(&res, &doc).unwrap().problems,
        Vec::<String>::new()
    );

    // A hand edit of the block fails the check.
    std::fs::write(&doc, page.replace("1 agrees", "2 agrees")).unwrap();
    let p = results::check(&res, &doc).unwrap().problems;
    assert!(p.len() == 1 && p[0].contains("no longer matches"), "{p:?}");
    std::fs::write(&doc, &page).unwrap();

    // The code path changes after the rows' commit: stale until a note explains it.
    std::fs::write(root.join("src/select.rs"), "v2\n").unwrap();
    git(root, &["commit", "-qam", "two"]);
    let p = results::check(&res, &doc).unwrap().problems;
    assert!(
        p.len() == 1 && p[0].contains("code paths changed after commit"),
        "{p:?}"
    );
    // Notes without the commit they vouch through: not a problem, but the section is
    // unchecked and the check says so.
    std::fs::write(
        res.join("sections.toml"),
        "[demo]\npaths = [\"src/select.rs\"]\nnotes = \"two only renames a variable\"\n",
    )
    .unwrap();
    let c = results::check(&res, &doc).unwrap();
    assert_eq!(c.problems, Vec::<String>::new());
    assert!(
        c.notes
            .iter()
            .any(|n| n.contains("`demo`") && n.contains("no `notes_through`")),
        "{:?}",
        c.notes
    );
    // Notes through "two" cover it ...
    let two = git(root, &["rev-parse", "--short", "HEAD"])
        .trim()
        .to_string();
    let vouched = format!(
        "[demo]\npaths = [\"src/select.rs\"]\nnotes = \"two only renames a variable\"\nnotes_through = \"{two}\"\n"
    );
    std::fs::write(res.join("sections.toml"), &vouched).unwrap();
    let c = results::check(&res, &doc).unwrap();
    assert_eq!(c.problems, Vec::<String>::new());
    assert!(c.notes.is_empty(), "{:?}", c.notes);
    // ... but not a later change, which stales the section again.
    std::fs::write(root.join("src/select.rs"), "v3\n").unwrap();
    git(root, &["commit", "-qam", "three"]);
    let three = git(root, &["rev-parse", "--short", "HEAD"])
        .trim()
        .to_string();
    let p = results::check(&res, &doc).unwrap().problems;
    assert!(
        p.len() == 1
            && p[0].contains(&format!(
                "after {two}, the last its `notes` account for (in {three})"
            )),
        "{p:?}"
    );
    // A notes_through that is no commit, and one without notes, are refused by name.
    std::fs::write(res.join("sections.toml"), vouched.replace(&two, "f00dfeed")).unwrap();
    let p = results::check(&res, &doc).unwrap().problems;
    assert!(
        p.len() == 1 && p[0].contains("`notes_through = \"f00dfeed\"`"),
        "{p:?}"
    );
    std::fs::write(
        res.join("sections.toml"),
        format!("[demo]\npaths = [\"src/select.rs\"]\nnotes_through = \"{three}\"\n"),
    )
    .unwrap();
    let p = results::check(&res, &doc).unwrap().problems;
    assert!(p.len() == 1 && p[0].contains("without `notes`"), "{p:?}");
}

#[test]
fn the_committed_example_matches_its_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results/example");
    let data = results::load(&root).unwrap();
    assert_eq!(data.rows.len(), 45);
    let page = std::fs::read_to_string(root.join("results.md")).unwrap();
    let body = results::render(&data, None)
        .unwrap()
        .remove("example")
        .unwrap();
    assert!(
        page.contains(&body),
        "rerun `fedsel results render --results results/example --doc results/example/results.md`"
    );
}

/// A results directory with one section, `demo`, of rounds to a target: fedcor and powd over
/// seeds 1-5 in setting S1, and in S2 with powd's seed 5 censored at 500 rounds.
fn claims_dir(claims: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut csv = String::from(
        "section,table,setting,method,metric,seed,value,censored,planned,command,commit,config_hash\n",
    );
    let s1 = [
        ("fedcor", [80.0, 50.0, 100.0, 40.0, 64.0]),
        ("powd", [100.0, 80.0, 125.0, 50.0, 80.0]),
    ];
    let s2 = [
        ("fedcor", [60.0, 70.0, 80.0, 90.0, 100.0]),
        ("powd", [90.0, 100.0, 110.0, 120.0, 500.0]),
    ];
    for (setting, arms) in [("S1", s1), ("S2", s2)] {
        for (method, values) in arms {
            for (i, v) in values.iter().enumerate() {
                let censored = setting == "S2" && method == "powd" && i == 4;
                let _ = writeln!(
                    csv,
                    "demo,T1,{setting},{method},rounds_to_target,{},{v},{censored},true,fedsel sweep x,abc1234,h",
                    i + 1
                );
            }
        }
    }
    std::fs::write(dir.path().join("demo.csv"), csv).unwrap();
    std::fs::write(dir.path().join("sections.toml"), "[demo]\npaths = []\n").unwrap();
    std::fs::create_dir_all(dir.path().join("claims")).unwrap();
    std::fs::write(dir.path().join("claims/paper.toml"), claims).unwrap();
    dir
}

const TESTED: &str = r#"
[[claim]]
id = "fedcor-faster"
paper = "FedCor"
quote = "FedCor achieves the specified accuracy faster than Pow-d"
place = "Sec. 5.2"
claimed = "fewer rounds than Pow-d"
section = "demo"
metric = "rounds_to_target"
settings = ["S1", "S2"]
a = "fedcor"
b = "powd"
effect = "log_ratio"
direction = "lower"

[[claim]]
id = "fedcor-cifar"
paper = "FedCor"
quote = "26% ~ 51% on CIFAR-10"
place = "Abstract"
claimed = "fewer rounds than Pow-d on CIFAR-10"
not_testable = "needs the CIFAR-10 CNN at 2,000 rounds"
"#;

/// A history in which every claim was written at `c0`, before (`true`) or after (`false`)
/// every run.
struct Fixed(bool);

impl History for Fixed {
    fn first_adding(&self, _: &str) -> Result<Option<String>, String> {
        Ok(Some("c0".into()))
    }
    fn is_ancestor(&self, _: &str, _: &str) -> Result<bool, String> {
        Ok(self.0)
    }
    fn versions(&self, file: &Path) -> Result<Vec<(String, Option<String>)>, String> {
        Ok(vec![("c0".into(), std::fs::read_to_string(file).ok())])
    }
    fn file_at(&self, _: &str, _: &str) -> Option<String> {
        None
    }
    fn first_recorded(&self) -> Result<std::collections::BTreeMap<String, String>, String> {
        Ok(Default::default())
    }
    fn changed(&self, _: &str, _: &str, _: &[String]) -> Result<Vec<String>, String> {
        Ok(Vec::new())
    }
}

fn claims_block(dir: &Path, history: &dyn History) -> String {
    results::render(&results::load(dir).unwrap(), Some(history))
        .unwrap()
        .remove("claims")
        .unwrap()
}

#[test]
fn a_claim_is_tested_by_hand_computed_pairs_and_rendered_first_class() {
    let dir = claims_dir(TESTED);
    let data = results::load(dir.path()).unwrap();
    assert_eq!(data.claims.len(), 2);
    let block = claims_block(dir.path(), &Fixed(true));
    // S1: b/a = 1.25, 1.6, 1.25, 1.25, 1.25. ln(a/b) has mean −0.272516 and s = 0.110399, so
    // the 95 % t half-width is 2.776445·0.110399/√5 = 0.137079; the geometric-mean ratio is
    // e^0.272516 = 1.313 within [e^0.135437, e^0.409594] = [1.145, 1.506]. Every pair favours
    // fedcor: the exact Wilcoxon p is 2/2^5 = 0.0625.
    assert!(
        block.contains("| `fedcor-faster` | FedCor | fewer rounds than Pow-d | S1 | as run (1-5) | fedcor vs powd, rounds_to_target | 5 | b/a = 1.313 [1.145, 1.506] | 0.0625 | reproduced |"),
        "{block}"
    );
    // S2: the censored seed enters at its bound (500 / 100) and the row says the effect is
    // then a bound; that pair's ln(1/5) = −1.609 beside −0.29 … −0.41 widens the interval
    // across 0.
    assert!(
        block.contains("| `fedcor-faster` | 〃 | 〃 | S2 | as run (1-5) | fedcor vs powd, rounds_to_target | 5 (B censored in 1) | b/a ≥ ")
            && block.contains(", a lower bound: the censored arm's values are only bounds | 0.0625 | not reproduced |"),
        "{block}"
    );
    assert!(
        block.contains("| `fedcor-cifar` | FedCor | fewer rounds than Pow-d on CIFAR-10 | — | — | — | — | — | — | not testable on CPU: needs the CIFAR-10 CNN at 2,000 rounds |"),
        "{block}"
    );
    // One count per claim: S2 fails, so the claim does.
    assert!(
        block.contains(
            "| pre-registered (written before its runs) | 0 | 0 | 0 | 1 | 0 | 0 | 0 | 0 | 1 |"
        ),
        "{block}"
    );
    assert!(
        block.contains("| `fedcor-faster` | authors' code | pre-registered: registered at `c0`, run at `abc1234` with its configs as registered | **not reproduced** |"),
        "{block}"
    );
    assert!(block.contains("Not counted: 1 not testable on CPU; 0 awaiting a rerun of rows marked not current; 0 repeating"));
    assert!(block.contains("- `fedcor-cifar` (FedCor, Abstract): “26% ~ 51% on CIFAR-10”"));

    // Written after its runs: counted apart, as post hoc.
    let block = claims_block(dir.path(), &Fixed(false));
    assert!(
        block.contains("| post hoc, no fresh seeds yet (the verdict on the seeds seen before it was written) | 0 | 0 | 0 | 1 | 0 | 0 | 0 | 0 | 1 |"),
        "{block}"
    );
    assert!(block.contains("post hoc: registered at `c0`, after its runs at `abc1234`"));

    // The other way round, S1's interval lies on the other side: contradicted.
    let flipped = TESTED.replace("direction = \"lower\"", "direction = \"higher\"");
    let block = claims_block(claims_dir(&flipped).path(), &Fixed(true));
    assert!(
        block.contains("| 0.0625 | contradicted |") && block.contains("**contradicted**"),
        "{block}"
    );
    let dir = claims_dir(TESTED);
    let csv = std::fs::read_to_string(dir.path().join("demo.csv")).unwrap();
    let without_seed_5: String = csv
        .lines()
        .filter(|l| !l.contains("fedcor,rounds_to_target,5,"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(dir.path().join("demo.csv"), without_seed_5).unwrap();
    let block = claims_block(dir.path(), &Fixed(true));
    assert!(block.contains("| 4 | b/a = "), "{block}");
    assert!(block.contains("**too few seeds**"), "{block}");

    // Seeds 6-9 added unplanned, with powd faster than fedcor: they would pull S1's effect
    // below 1, but an unplanned row never enters a verdict, so S1 still reads 1.313.
    let dir = claims_dir(TESTED);
    let mut csv = std::fs::read_to_string(dir.path().join("demo.csv")).unwrap();
    for seed in 6..10 {
        for (method, v) in [("fedcor", 300.0), ("powd", 30.0)] {
            let _ = writeln!(
                csv,
                "demo,T1,S1,{method},rounds_to_target,{seed},{v},false,false,fedsel sweep x,def5678,h"
            );
        }
    }
    std::fs::write(dir.path().join("demo.csv"), csv).unwrap();
    let block = claims_block(dir.path(), &Fixed(true));
    assert!(
        block.contains("| S1 | as run (1-5) | fedcor vs powd, rounds_to_target | 5 | b/a = 1.313 [1.145, 1.506] | 0.0625 | reproduced |"),
        "{block}"
    );
    // Nor do they count among the claim's runs (their commit is not named).
    assert!(
        block.contains(
            "pre-registered: registered at `c0`, run at `abc1234` with its configs as registered |"
        ) && !block.contains("def5678"),
        "{block}"
    );
}

/// Hand-made rows for each verdict, a stated size, pairs both censored, and an arm that
/// repeats another.
#[test]
fn hand_made_rows_give_each_verdict_and_name_a_repeated_arm() {
    let dir = tempfile::tempdir().unwrap();
    let mut csv = String::from(
        "section,table,setting,method,metric,seed,value,censored,planned,command,commit,config_hash\n",
    );
    // Per setting: A's and B's rounds on seeds 1-5 (None: censored at 200).
    type Arm = [Option<f64>; 5];
    let arms: [(&str, Arm, Arm); 4] = [
        // b/a = 1.25 on every seed: reproduced for "1.2-1.3", direction only for "1.5-2".
        (
            "up",
            [100.0, 80.0, 120.0, 60.0, 40.0].map(Some),
            [125.0, 100.0, 150.0, 75.0, 50.0].map(Some),
        ),
        // b/a = 0.8 on every seed: contradicted.
        (
            "down",
            [125.0, 100.0, 150.0, 75.0, 50.0].map(Some),
            [100.0, 80.0, 120.0, 60.0, 40.0].map(Some),
        ),
        // Both ways: not reproduced.
        (
            "mixed",
            [100.0, 125.0, 100.0, 125.0, 110.0].map(Some),
            [125.0, 100.0, 125.0, 100.0, 110.0].map(Some),
        ),
        // Neither arm reaches the target on any seed.
        ("never", [None; 5], [None; 5]),
    ];
    for (setting, a, b) in arms {
        for (method, values) in [("fast", a), ("slow", b), ("slow-copy", b)] {
            for (i, v) in values.iter().enumerate() {
                // The copy differs from `slow` in the fourth decimal only.
                let copy = if method == "slow-copy" { 0.0002 } else { 0.0 };
                let _ = writeln!(
                    csv,
                    "demo,T1,{setting},{method},rounds_to_target,{},{},{},true,x,abc1234,h",
                    i + 1,
                    v.unwrap_or(200.0) + copy,
                    v.is_none()
                );
            }
        }
    }
    std::fs::write(dir.path().join("demo.csv"), csv).unwrap();
    std::fs::create_dir_all(dir.path().join("claims")).unwrap();
    let claim = |id: &str, setting: &str, b: &str, size: &str| {
        format!(
            "[[claim]]\nid = \"{id}\"\npaper = \"P\"\nquote = \"q\"\nplace = \"p\"\nclaimed = \"c\"\nsection = \"demo\"\nmetric = \"rounds_to_target\"\nsettings = [\"{setting}\"]\na = \"fast\"\nb = \"{b}\"\neffect = \"log_ratio\"\ndirection = \"lower\"\n{size}\n"
        )
    };
    let claims = [
        claim("sized", "up", "slow", "size = [1.2, 1.3]"),
        claim("missed", "up", "slow", "size = [1.5, 2.0]"),
        claim("reversed", "down", "slow", ""),
        claim("straddling", "mixed", "slow", ""),
        claim("censored", "never", "slow", ""),
        claim("sized-copy", "up", "slow-copy", "size = [1.2, 1.3]"),
    ]
    .concat();
    std::fs::write(dir.path().join("claims/p.toml"), claims).unwrap();
    let block = claims_block(dir.path(), &Fixed(true));
    let verdict_of = |id: &str| {
        block
            .lines()
            .find(|l| l.starts_with(&format!("| `{id}` | authors' code |")))
            .unwrap_or_else(|| panic!("{id}: {block}"))
            .to_string()
    };
    assert!(
        verdict_of("sized").ends_with("| **reproduced** |"),
        "{block}"
    );
    assert!(
        block.contains("| reproduced (the point lies in the stated b/a 1.2-1.3) |"),
        "{block}"
    );
    assert!(
        verdict_of("missed").ends_with("| **direction only** |"),
        "{block}"
    );
    // b/a = 1.25 exactly on every seed: the interval is the point 1.250, 0.25 below 1.5.
    assert!(
        block.contains(
            "| direction only: the interval ends at 1.250, 0.250 below the stated b/a 1.5-2 |"
        ),
        "{block}"
    );
    assert!(
        verdict_of("reversed").ends_with("| **contradicted** |"),
        "{block}"
    );
    assert!(
        verdict_of("straddling").ends_with("| **not reproduced** |"),
        "{block}"
    );
    assert!(
        verdict_of("censored").ends_with("| **too few informative seeds** |"),
        "{block}"
    );
    assert!(
        block
            .contains("| 0 (5 with both censored, left out) | — | — | too few informative seeds |"),
        "{block}"
    );
    assert!(
        verdict_of("sized-copy").contains(
            "reproduced — not counted: repeats `sized` (`slow-copy` equals `slow` to 3 decimals on every seed)"
        ),
        "{block}"
    );
    assert!(
        block.contains(
            "| pre-registered (written before its runs) | 1 | 1 | 0 | 1 | 1 | 0 | 0 | 1 | 5 |"
        ),
        "{block}"
    );
    // A size on the wrong side of the claim is refused.
    let bad = claim("wrong", "up", "slow", "size = [0.5, 0.9]");
    std::fs::write(dir.path().join("claims/p.toml"), bad).unwrap();
    let e = results::load(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("claim `wrong`") && e.contains("b/a above 1"),
        "{e}"
    );
}

/// A claim repeats another only if its arms hold the same values in every section the two
/// read, the fresh seeds included; and a claim whose rows are marked not current is shown
/// but not counted.
#[test]
fn a_repeat_holds_on_fresh_seeds_too_and_rows_not_current_are_not_counted() {
    let write = |dir: &Path, fresh_copy: f64, sections: &str| {
        let mut csv = String::from(
            "section,table,setting,method,metric,seed,value,censored,planned,command,commit,config_hash\n",
        );
        for (section, seeds, copy) in [
            ("demo", 1..=5u64, 0.0002),
            ("demo-fresh", 11..=15, fresh_copy),
        ] {
            for seed in seeds {
                let (a, b) = (100.0 + seed as f64, 125.0 + 1.25 * seed as f64);
                for (method, v) in [("fast", a), ("slow", b), ("slow-copy", b + copy)] {
                    let _ = writeln!(
                        csv,
                        "{section},T1,up,{method},rounds_to_target,{seed},{v},false,true,x,abc1234,h"
                    );
                }
            }
        }
        std::fs::write(dir.join("demo.csv"), csv).unwrap();
        std::fs::write(dir.join("sections.toml"), sections).unwrap();
        std::fs::create_dir_all(dir.join("claims")).unwrap();
        let claim = |id: &str, b: &str| {
            format!(
                "[[claim]]\nid = \"{id}\"\npaper = \"P\"\nquote = \"q\"\nplace = \"p\"\nclaimed = \"c\"\nsection = \"demo\"\nconfirmatory_section = \"demo-fresh\"\nmetric = \"rounds_to_target\"\na = \"fast\"\nb = \"{b}\"\neffect = \"log_ratio\"\ndirection = \"lower\"\n"
            )
        };
        std::fs::write(
            dir.join("claims/p.toml"),
            [claim("first", "slow"), claim("second", "slow-copy")].concat(),
        )
        .unwrap();
        claims_block(dir, &Fixed(true))
    };
    let plain = "[demo]\npaths = []\n[demo-fresh]\npaths = []\n";
    let dir = tempfile::tempdir().unwrap();
    // Equal to 3 decimals as run and on the fresh seeds: a repeat.
    let block = write(dir.path(), 0.0003, plain);
    assert!(
        block.contains("; 1 repeating another claim's result (`second` repeats `first`)"),
        "{block}"
    );
    // Apart by 0.002 on the fresh seeds alone: two results, both counted.
    let block = write(dir.path(), 0.002, plain);
    assert!(
        block.contains("; 0 repeating another claim's result.")
            && block.contains("| `second` | authors' code | pre-registered"),
        "{block}"
    );
    // `slow`'s rows marked not current: the claim reading them awaits a rerun.
    let stale = "[demo]\npaths = []\nnot_current = [\"slow\"]\n[demo-fresh]\npaths = []\n";
    let block = write(dir.path(), 0.002, stale);
    assert!(
        block.contains("| **reproduced** |")
            && block.contains("reproduced — not counted: awaiting rerun (the rows of `slow` in `demo` are marked not current in sections.toml)")
            && block.contains("1 awaiting a rerun of rows marked not current (`first`)")
            && block.contains("1 claims counted of 2"),
        "{block}"
    );
}

/// The history in a real repository: a claim committed before the runs' commit is
/// pre-registered; one added after is post hoc, and its fresh seeds, run after the commit
/// that names their section, are the verdict counted.
#[test]
fn check_dates_claims_by_the_git_history() {
    let repo = tempfile::tempdir().unwrap();
    let root = repo.path();
    git(root, &["init", "-q"]);
    let res = root.join("results");
    std::fs::create_dir_all(res.join("claims")).unwrap();
    let early = TESTED.replace("fedcor-cifar", "early");
    std::fs::write(res.join("claims/early.toml"), &early).unwrap();
    std::fs::write(res.join("x"), "code\n").unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "claims before the runs"]);
    let run = git(root, &["rev-parse", "HEAD"]).trim().to_string();
    let rows = |section: &str, seeds: std::ops::RangeInclusive<u64>, commit: &str| {
        let mut csv = String::from(
            "section,table,setting,method,metric,seed,value,censored,planned,command,commit,config_hash\n",
        );
        for seed in seeds {
            for (method, v) in [
                ("fedcor", 80.0 + seed as f64),
                ("powd", 100.0 + 2.0 * seed as f64),
            ] {
                for setting in ["S1", "S2"] {
                    let _ = writeln!(
                        csv,
                        "{section},T1,{setting},{method},rounds_to_target,{seed},{v},false,true,x,{commit},h"
                    );
                }
            }
        }
        csv
    };
    std::fs::write(res.join("demo.csv"), rows("demo", 1..=5, &run)).unwrap();
    std::fs::write(
        res.join("sections.toml"),
        "[demo]\npaths = []\n[demo-fresh]\npaths = []\n",
    )
    .unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "the runs' rows"]);
    // Written after the runs, with a confirmatory set to come.
    let late = TESTED
        .replace("fedcor-faster", "late")
        .replace("fedcor-cifar", "late-cifar")
        .replace(
            "direction = \"lower\"",
            "direction = \"lower\"\nconfirmatory_section = \"demo-fresh\"",
        );
    std::fs::write(res.join("claims/late.toml"), &late).unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "a claim after its runs"]);
    let late_commit = git(root, &["rev-parse", "--short=7", "HEAD"])
        .trim()
        .to_string();
    let doc = root.join("page.md");
    std::fs::write(&doc, "<!-- results:claims begin -->\n<!-- results:claims end -->\n<!-- results:demo begin -->\n<!-- results:demo end -->\n").unwrap();
    results::render_doc(&res, &doc).unwrap();
    let c = results::check(&res, &doc).unwrap();
    assert_eq!(c.problems, Vec::<String>::new());
    assert_eq!(c.notes.len(), 1, "{:?}", c.notes);
    assert!(
        c.notes[0].contains(&format!(
            "claim `late`: post hoc: registered at `{late_commit}`, after its runs at `{}`; no confirmatory runs",
            &run[..7]
        )),
        "{:?}",
        c.notes
    );
    let page = std::fs::read_to_string(&doc).unwrap();
    assert!(page.contains("| fresh seeds (not run yet) |"), "{page}");
    // The fresh seeds run after the claim: their verdict counts.
    std::fs::write(
        res.join("fresh.csv"),
        rows("demo-fresh", 11..=15, &late_commit),
    )
    .unwrap();
    std::fs::write(&doc, "<!-- results:claims begin -->\n<!-- results:claims end -->\n<!-- results:demo begin -->\n<!-- results:demo end -->\n<!-- results:demo-fresh begin -->\n<!-- results:demo-fresh end -->\n").unwrap();
    results::render_doc(&res, &doc).unwrap();
    let c = results::check(&res, &doc).unwrap();
    assert_eq!(c.problems, Vec::<String>::new());
    assert!(
        c.notes[0].contains("confirmatory set pre-registered"),
        "{:?}",
        c.notes
    );
    let page = std::fs::read_to_string(&doc).unwrap();
    assert!(
        page.contains("| post hoc, confirmed on fresh seeds (the fresh seeds' verdict counts) | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 1 |")
            && page.contains("| pre-registered (written before its runs) | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 1 |")
            && page.contains("| S1 | fresh seeds (11-15) |"),
        "{page}"
    );
    // A directory outside any repository: the claims block is kept and check says why.
    let lone = tempfile::tempdir().unwrap();
    for f in [
        "demo.csv",
        "fresh.csv",
        "sections.toml",
        "claims/early.toml",
        "claims/late.toml",
    ] {
        std::fs::create_dir_all(lone.path().join("claims")).unwrap();
        std::fs::copy(res.join(f), lone.path().join(f)).unwrap();
    }
    let lone_doc = lone.path().join("page.md");
    std::fs::copy(&doc, &lone_doc).unwrap();
    let r = results::render_doc(lone.path(), &lone_doc).unwrap();
    assert!(r.claims_kept.is_some());
    assert_eq!(std::fs::read_to_string(&lone_doc).unwrap(), page);
    let c = results::check(lone.path(), &lone_doc).unwrap();
    assert_eq!(c.problems, Vec::<String>::new());
    assert!(
        c.notes[0].starts_with("the claims block was not checked"),
        "{:?}",
        c.notes
    );
}

/// Pre-registration is earned from the history, not typed: a claim registered before its
/// rows is pre-registered only while the rows ran with its arms' configs as they stood at
/// registration (a `base` file included), and a claim whose test changes after its rows is
/// registered anew, after them.
#[test]
fn a_claim_turns_post_hoc_when_its_arms_configs_or_its_test_change_after_registration() {
    let repo = tempfile::tempdir().unwrap();
    let root = repo.path();
    git(root, &["init", "-q"]);
    let res = root.join("results");
    std::fs::create_dir_all(res.join("claims")).unwrap();
    std::fs::create_dir_all(root.join("configs/demo")).unwrap();
    std::fs::write(root.join("configs/base.toml"), "rounds = 100\n").unwrap();
    let sweep_text = "base = \"../base.toml\"\nname = \"demo\"\n[axes]\nstrategy = [\"fedcor\", \"powd\"]\nseed = [1, 2, 3, 4, 5]\n";
    std::fs::write(root.join("configs/demo/sweep.toml"), sweep_text).unwrap();
    std::fs::write(root.join("configs/other.toml"), "rounds = 7\n").unwrap();
    let claim = TESTED.replace("fedcor-cifar", "cifar");
    std::fs::write(res.join("claims/p.toml"), &claim).unwrap();
    std::fs::write(res.join("sections.toml"), "[demo]\npaths = []\n").unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "the claim and its arms"]);
    let head = |root: &Path| git(root, &["rev-parse", "HEAD"]).trim().to_string();
    let registered = head(root);
    // Each (method, seed)'s config hash, as `fedsel sweep configs/demo/sweep.toml` run from
    // the checkout's root gives it.
    let hashes = |root: &Path| -> std::collections::BTreeMap<(String, u64), String> {
        let text = std::fs::read_to_string(root.join("configs/demo/sweep.toml")).unwrap();
        fedsel_workbench::sweep::Sweep::from_toml_str(
            &text,
            "configs/demo/sweep.toml",
            Path::new("configs/demo"),
            &[],
            |p| Ok(std::fs::read_to_string(root.join(p)).unwrap()),
        )
        .and_then(|s| s.cells())
        .unwrap()
        .into_iter()
        .map(|c| ((c.config.selection.strategy.clone(), c.config.seed), c.hash))
        .collect()
    };
    let rows = |commit: &str, hashes: &std::collections::BTreeMap<(String, u64), String>| {
        let mut csv = String::from(
            "section,table,setting,method,metric,seed,value,censored,planned,command,commit,config_hash\n",
        );
        for seed in 1..=5u64 {
            for (method, v) in [
                ("fedcor", 80.0 + seed as f64),
                ("powd", 100.0 + 2.0 * seed as f64),
            ] {
                let h = &hashes[&(method.to_string(), seed)];
                for setting in ["S1", "S2"] {
                    let _ = writeln!(
                        csv,
                        "demo,T1,{setting},{method},rounds_to_target,{seed},{v},false,true,fedsel sweep configs/demo/sweep.toml --out runs/demo,{commit},{h}"
                    );
                }
            }
        }
        csv
    };
    let notes = |res: &Path| {
        let doc = res.parent().unwrap().join("page.md");
        std::fs::write(&doc, "").unwrap();
        results::render_doc(res, &doc).unwrap();
        let c = results::check(res, &doc).unwrap();
        assert_eq!(c.problems, Vec::<String>::new());
        (c.notes, std::fs::read_to_string(&doc).unwrap())
    };
    let first = hashes(root);
    // Run at the registering commit; a config no arm reads changes afterwards.
    std::fs::write(res.join("demo.csv"), rows(&registered, &first)).unwrap();
    std::fs::write(root.join("configs/other.toml"), "rounds = 8\n").unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "rows; an unrelated config"]);
    let (n, page) = notes(&res);
    assert!(n.is_empty(), "{n:?}");
    assert!(
        page.contains(&format!(
            "pre-registered: registered at `{}`, run at `{}` with its configs as registered",
            &registered[..7],
            &registered[..7]
        )),
        "{page}"
    );
    // The sweep file changes without changing its cells (a comment), and the rows are rerun
    // after it: each row's config hash is one the registered sweep gives, so they count.
    std::fs::write(
        root.join("configs/demo/sweep.toml"),
        format!("# the same cells\n{sweep_text}"),
    )
    .unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "a comment in the sweep"]);
    let same = head(root);
    assert_eq!(hashes(root), first);
    std::fs::write(res.join("demo.csv"), rows(&same, &first)).unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "rows rerun"]);
    let (n, _) = notes(&res);
    assert!(n.is_empty(), "{n:?}");
    // The base the sweep reads changes, and the rows are rerun after it: post hoc.
    std::fs::write(root.join("configs/base.toml"), "rounds = 200\n").unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "the arms' base changes"]);
    let rerun = head(root);
    let second = hashes(root);
    assert_ne!(second, first);
    std::fs::write(res.join("demo.csv"), rows(&rerun, &second)).unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "rows rerun"]);
    let second_recorded = head(root);
    let (n, page) = notes(&res);
    assert_eq!(
        n,
        [format!(
            "claim `fedcor-faster`: post hoc: registered at `{}`; its arms' configs changed before the runs at `{}` (configs/base.toml, configs/demo/sweep.toml); no confirmatory runs",
            &registered[..7],
            &rerun[..7]
        )]
    );
    assert!(
        page.contains("| post hoc, no fresh seeds yet (the verdict on the seeds seen before it was written) | 1 | 0 | 0 | 0 |"),
        "{page}"
    );
    // Back to the first rows; then the claim's stated size is added after them: the test is
    // registered anew, after its runs.
    std::fs::write(res.join("demo.csv"), rows(&registered, &first)).unwrap();
    std::fs::write(
        res.join("claims/p.toml"),
        claim.replacen(
            "direction = \"lower\"",
            "direction = \"lower\"\nsize = [1.1, 2.0]",
            1,
        ),
    )
    .unwrap();
    let (n, _) = notes(&res);
    assert_eq!(
        n,
        [
            "claim `fedcor-faster`: unknown: the test of \"fedcor-faster\" changed since its last commit"
        ]
    );
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "a size after the rows"]);
    let resized = head(root);
    let (n, _) = notes(&res);
    assert_eq!(
        n,
        [format!(
            "claim `fedcor-faster`: post hoc: registered at `{}`, after its runs at `{}`; no confirmatory runs",
            &resized[..7],
            &registered[..7]
        )]
    );
    // Rewording the quote is no change to the test.
    std::fs::write(
        res.join("claims/p.toml"),
        std::fs::read_to_string(res.join("claims/p.toml"))
            .unwrap()
            .replace("faster than Pow-d\"", "faster than Pow-d (reworded)\""),
    )
    .unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "a reworded quote"]);
    let (again, _) = notes(&res);
    assert_eq!(again, n);
    // Rerunning, after the claim, the runs seen before it (the same configs, seeds and all)
    // does not make it pre-registered: those runs' rows were on record before it.
    std::fs::write(root.join("x"), "a later commit\n").unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "later"]);
    let later = head(root);
    std::fs::write(res.join("demo.csv"), rows(&later, &second)).unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "the seen runs again"]);
    let (n, _) = notes(&res);
    assert_eq!(
        n,
        [format!(
            "claim `fedcor-faster`: post hoc: registered at `{}`; the runs at `{}` repeat runs on record before it (at `{}`); no confirmatory runs",
            &resized[..7],
            &later[..7],
            &second_recorded[..7]
        )]
    );
}

#[test]
fn a_bad_claim_is_named_with_its_file() {
    let err = |claims: &str| {
        results::load(claims_dir(claims).path())
            .unwrap_err()
            .to_string()
    };
    let e = err(&TESTED.replace("section = \"demo\"\n", ""));
    assert!(
        e.contains("paper.toml") && e.contains("claim `fedcor-faster`: no `section`"),
        "{e}"
    );
    let e = err(&TESTED.replace("section = \"demo\"", "section = \"nope\""));
    assert!(
        e.contains("claim `fedcor-faster`: section `nope` has no rows or paper values"),
        "{e}"
    );
    let e = err(&TESTED.replace("\"S2\"]", "\"S3\"]"));
    assert!(
        e.contains("setting `S3` is no setting of section `demo` (settings: S1, S2)"),
        "{e}"
    );
    let e = err(&TESTED.replace("b = \"powd\"", "b = \"afl\""));
    assert!(
        e.contains("`b` = `afl` is no method of section `demo` (methods: fedcor, powd)"),
        "{e}"
    );
    let e = err(&TESTED.replace("not_testable", "a = \"x\"\nnot_testable"));
    assert!(
        e.contains("claim `fedcor-cifar`: has both `not_testable` and `a`"),
        "{e}"
    );
    let e = err(&TESTED.replace("effect = \"log_ratio\"", "effect = \"ratio\""));
    assert!(e.contains("paper.toml") && e.contains("ratio"), "{e}");
    let e = err(&TESTED.replace("id = \"fedcor-cifar\"", "id = \"fedcor-faster\""));
    assert!(e.contains("claim `fedcor-faster` is also in"), "{e}");
    let e = err(&TESTED.replace("id = \"fedcor-cifar\"", "id = \"FedCor CIFAR\""));
    assert!(e.contains("kebab-case"), "{e}");
}

#[test]
fn the_committed_page_holds_its_claims_and_sections_as_rendered() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let data = results::load(&root.join("results")).unwrap();
    assert!(!data.claims.is_empty());
    let page = std::fs::read_to_string(root.join("docs/results.md")).unwrap();
    let git = results::Git::open(&root.join("results")).ok();
    let history = git.as_ref().map(|g| g as &dyn History);
    for (name, body) in results::render(&data, history).unwrap() {
        assert!(
            page.contains(&format!(
                "<!-- results:{name} begin -->\n{body}<!-- results:{name} end -->"
            )),
            "block `{name}`: rerun `fedsel results render`"
        );
    }
}

/// A one-cell sweep whose run recorded `commit` as its build (`None`: no record).
fn sweep_with_commit(root: &Path, strategy: &str, commit: Option<&str>) -> std::path::PathBuf {
    let sweep = root.join(format!("sweep-{strategy}"));
    let c = cell(&sweep, strategy, 1, 0.7, Some(5));
    let summary = sweep
        .join("cells")
        .join(format!("{strategy}-s1/summary.json"));
    let mut s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    if let Some(commit) = commit {
        s["commit"] = commit.into();
    }
    std::fs::write(&summary, s.to_string()).unwrap();
    std::fs::write(
        sweep.join("sweep.json"),
        serde_json::json!({ "name": "c", "baseline": strategy, "cells": [c] }).to_string(),
    )
    .unwrap();
    sweep
}

#[test]
fn collect_takes_the_commit_the_runs_record_and_refuses_one_that_disagrees() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let res = root.join("results");
    let full = "0123456789abcdef0123456789abcdef01234567";
    let recorded = sweep_with_commit(root, "uniform", Some(full));
    let mut a = args("final_acc", "unused");
    a.commit = None;
    results::collect(&recorded, &res, &a).unwrap();
    let rows = std::fs::read_to_string(res.join("demo.csv")).unwrap();
    assert!(rows.contains(&format!(",{full},")), "{rows}");
    // An abbreviation of the recorded commit agrees; another commit is refused by name.
    let short = sweep_with_commit(root, "md", Some(full));
    results::collect(&short, &res, &args("final_acc", "0123456")).unwrap();
    let other = sweep_with_commit(root, "powd", Some(full));
    let err = results::collect(&other, &res, &args("final_acc", "fedcba9"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "was run at commit {full}, not at --commit fedcba9"
        )),
        "{err}"
    );
    // A run that records none needs the flag, and says so.
    let old = sweep_with_commit(root, "afl", None);
    let err = results::collect(&old, &res, &a).unwrap_err().to_string();
    assert!(
        err.contains("records no commit") && err.contains("--commit"),
        "{err}"
    );
    results::collect(&old, &res, &args("final_acc", "abc1234")).unwrap();
}

#[test]
fn collect_refuses_a_dirty_or_mixed_build_for_counted_rows_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let res = root.join("results");
    let mut a = args("final_acc", "unused");
    a.commit = None;
    let dirty = sweep_with_commit(root, "uniform", Some("0123abc+dirty"));
    let err = results::collect(&dirty, &res, &a).unwrap_err().to_string();
    assert!(
        err.contains("uncommitted changes (0123abc+dirty)") && err.contains("--unplanned"),
        "{err}"
    );
    let mixed = sweep_with_commit(root, "md", Some("0123abc, 4567def"));
    let err = results::collect(&mixed, &res, &a).unwrap_err().to_string();
    assert!(err.contains("several commits (0123abc, 4567def)"), "{err}");
    // As an arm added after the plan, shown and never counted, it is collected.
    a.unplanned = vec!["uniform".into()];
    results::collect(&dirty, &res, &a).unwrap();
    let rows = std::fs::read_to_string(res.join("demo.csv")).unwrap();
    assert!(
        rows.contains(",false,fedsel sweep demo.toml --out runs/demo,0123abc+dirty,"),
        "{rows}"
    );
}

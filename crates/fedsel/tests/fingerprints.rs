//! Fingerprints of short runs: every strategy, every round policy, stale updates, FedBuff,
//! per-client orders (PyramidFL), the sample pass (FedBalancer), FedProx and FedAdam, and
//! the three availability families (FedGS's, F3AST's, a trace). Each run's outputs
//! (`metrics.csv` without its wall-clock column, `selections.csv`, and `summary.json`
//! without `wall_s`, `cpu` and `commit`) are hashed and compared with `tests/data/fingerprints.txt`,
//! so that a change meant to move code without changing behaviour is checked against every
//! kind of run at once: any changed bit of any output of any run fails by name.
//!
//! The runs train the logistic regression on the built-in Synthetic data. Their last bits
//! depend on the instruction set (`gemm`'s and the fused kernels' per-CPU blocking: most of
//! the AVX2 and AVX-512 fingerprints differ, as FedCor's GP does), so every line names the
//! instruction set it was recorded on and is checked there; a machine of another set
//! checks nothing and says so.
//!
//! After a deliberate change of behaviour, record the set again and say why in the commit:
//! `FEDSEL_RECORD_FINGERPRINTS=1 cargo test --release --test fingerprints`.

#[allow(dead_code)]
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fedsel::engine;
use fedsel::output::RunWriter;

/// The cases: a name and its overrides
/// of the built-in default (Synthetic(0.5, 0.5), 30 clients, logistic regression).
fn cases(trace: &Path) -> Vec<(&'static str, Vec<String>)> {
    let clock = "system.kind=\"lognormal\"";
    let overcommit = "system.round.policy=\"overcommit\"";
    let deadline = "system.round={policy=\"deadline\", deadline_s=3.0}";
    let plain = |strategy: &str| vec![format!("selection.strategy=\"{strategy}\"")];
    let timed = |strategy: &str, policy: &str| {
        vec![
            format!("selection.strategy=\"{strategy}\""),
            clock.to_string(),
            policy.to_string(),
        ]
    };
    let mut cases: Vec<(&'static str, Vec<String>)> = vec![
        ("uniform", plain("uniform")),
        ("md", plain("md")),
        ("powd", plain("powd")),
        ("cpowd", plain("cpowd")),
        ("rpowd", plain("rpowd")),
        ("afl", plain("afl")),
        ("fedgs", plain("fedgs")),
        ("f3ast", plain("f3ast")),
        ("hics", plain("hics")),
        ("cs1", plain("cs1")),
        ("cs2", plain("cs2")),
        ("divfl", plain("divfl")),
        ("oort", timed("oort", overcommit)),
        ("fedcs", timed("fedcs", deadline)),
        ("tifl", timed("tifl", "system.round.policy=\"wait_all\"")),
        ("fedbalancer", timed("fedbalancer", deadline)),
        // PyramidFL over-commits inside itself: the engine's over-commitment on top is refused.
        (
            "pyramidfl",
            timed("pyramidfl", "system.round.policy=\"wait_all\""),
        ),
        (
            "uniform-wait-all",
            timed("uniform", "system.round.policy=\"wait_all\""),
        ),
        (
            "refl-stale-unlimited",
            [
                timed("refl", deadline),
                vec!["system.stale={stale_update=-1}".into()],
            ]
            .concat(),
        ),
        (
            "uniform-stale-2-overcommit",
            [
                timed(
                    "uniform",
                    "system.round={policy=\"overcommit\", overcommit=0.5}",
                ),
                vec!["system.stale={stale_update=2, stale_factor=-4}".into()],
            ]
            .concat(),
        ),
        (
            "oort-fedbuff",
            timed(
                "oort",
                "system.round={policy=\"fedbuff\", concurrency=8, buffer_size=4}",
            ),
        ),
        (
            "fedprox",
            vec![
                "selection.strategy=\"md\"".into(),
                "train.prox_mu=0.01".into(),
            ],
        ),
        (
            "fedadam",
            vec!["server.optimizer=\"adam\"".into(), "server.lr=0.02".into()],
        ),
        (
            "availability-fedgs-ldf",
            vec![
                "selection.strategy=\"fedgs\"".into(),
                "availability={kind=\"ldf\", beta=0.5}".into(),
            ],
        ),
        (
            "availability-f3ast-smartphones",
            vec![
                "selection.strategy=\"f3ast\"".into(),
                "availability.kind=\"smartphones\"".into(),
                "budget={kind=\"random\", min=2, max=6}".into(),
            ],
        ),
        (
            "availability-trace",
            vec![
                "selection.strategy=\"powd\"".into(),
                format!(
                    "availability={{kind=\"trace\", trace={:?}}}",
                    trace.display().to_string()
                ),
            ],
        ),
        // Killed after round 6 and resumed from its checkpoint at round 4.
        (
            "divfl-resumed",
            vec![
                "selection.strategy=\"divfl\"".into(),
                "checkpoint_every=4".into(),
            ],
        ),
    ];
    for strategy in ["fedcor", "fedgp"] {
        cases.push((
            strategy,
            vec![
                format!("selection.strategy=\"{strategy}\""),
                "selection.fedcor.warmup=3".into(),
                "selection.fedcor.interval=3".into(),
                "selection.fedcor.steps=20".into(),
            ],
        ));
    }
    cases
}

/// A trace of 30 clients over 5 rounds: client k active in round r when (k + r) % 3 ≠ 0.
fn write_trace(dir: &Path) -> PathBuf {
    let path = dir.join("trace.csv");
    let mut text = String::from("round,client\n");
    for r in 0..5 {
        for k in (0..30).filter(|k| (k + r) % 3 != 0) {
            text.push_str(&format!("{r},{k}\n"));
        }
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// The hash of a run directory's outputs, wall-clock fields left out.
fn fingerprint(dir: &Path) -> String {
    let mut all = common::metrics_without_time(dir).join("\n");
    all.push('\n');
    all.push_str(&std::fs::read_to_string(dir.join("selections.csv")).unwrap());
    let mut summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let map = summary.as_object_mut().unwrap();
    map.remove("wall_s");
    map.remove("cpu");
    map.remove("commit");
    all.push_str(&serde_json::to_string(&summary).unwrap());
    fedsel::digest::sha256_hex(all.as_bytes())
}

const FILE: &str = "tests/data/fingerprints.txt";

#[test]
fn every_kind_of_run_keeps_its_fingerprint() {
    let tmp = tempfile::tempdir().unwrap();
    // FEDSEL_FINGERPRINT_DIR keeps the runs there, to compare two builds' outputs field by
    // field where their fingerprints differ.
    let kept = std::env::var_os("FEDSEL_FINGERPRINT_DIR").map(PathBuf::from);
    let base = kept.as_deref().unwrap_or(tmp.path());
    let trace = write_trace(base);
    let isa = fedsel::cpu::isa().name();
    let mut got = BTreeMap::new();
    for (name, set) in cases(&trace) {
        let set = [vec!["rounds=12".to_string()], set].concat();
        let refs: Vec<&str> = set.iter().map(String::as_str).collect();
        let exp = common::synthetic(&refs);
        let dir = if name.ends_with("-resumed") {
            let r = common::Resumed::run(&exp, 6, 4);
            RunWriter::resume(r.broken.path(), 12)
                .unwrap()
                .finish(&r.resumed)
                .unwrap();
            let dir = base.join(name);
            std::fs::rename(r.broken.path(), &dir).unwrap();
            dir
        } else {
            let dir = base.join(name);
            let mut w = RunWriter::create(&dir, &exp.config).unwrap();
            let summary = engine::run(&exp, &mut w).unwrap();
            w.finish(&summary).unwrap();
            dir
        };
        got.insert(format!("{name}@{isa}"), fingerprint(&dir));
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(FILE);
    if std::env::var_os("FEDSEL_RECORD_FINGERPRINTS").is_some() {
        let mut text = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.starts_with('#') || l.split_once('@').is_some_and(|(_, r)| !r.starts_with(isa))
            })
            .map(|l| format!("{l}\n"))
            .collect::<String>();
        for (k, v) in &got {
            text.push_str(&format!("{k} {v}\n"));
        }
        std::fs::write(&path, text).unwrap();
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let want: BTreeMap<&str, &str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let mut wrong = Vec::new();
    let here: Vec<&&str> = want
        .keys()
        .filter(|k| k.ends_with(&format!("@{isa}")))
        .collect();
    if here.is_empty() {
        eprintln!(
            "SKIPPED: no fingerprint is recorded for this instruction set ({isa}); record them with FEDSEL_RECORD_FINGERPRINTS=1 from the commit the others were recorded at"
        );
        return;
    }
    // A case whose outputs changed on purpose is recorded anew on the instruction set at
    // hand; on another one its old line is removed, and that CPU kind skips it, saying so,
    // until someone records it there.
    let mut unrecorded = Vec::new();
    for (k, v) in &got {
        let case = k.split_once('@').map_or(k.as_str(), |(c, _)| c);
        match want.get(k.as_str()) {
            Some(w) if w == v => {}
            Some(_) => wrong.push(format!("{k}: outputs changed")),
            None if want
                .keys()
                .any(|w| w.split_once('@').is_some_and(|(c, _)| c == case)) =>
            {
                unrecorded.push(k.as_str())
            }
            None => wrong.push(format!("{k}: no fingerprint recorded")),
        }
    }
    if !unrecorded.is_empty() {
        eprintln!(
            "SKIPPED {}: recorded on another instruction set only; record them here with FEDSEL_RECORD_FINGERPRINTS=1",
            unrecorded.join(", ")
        );
    }
    for k in here {
        if !got.contains_key(*k) {
            wrong.push(format!("{k}: recorded but no longer run"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

//! Every config shipped under `configs/` parses and validates: run configs as configs,
//! sweep files (those with `[axes]`) with every cell resolved.

use std::path::{Path, PathBuf};

use fedsel::availability::trace::TraceConfig;
use fedsel::config::{AvailabilityConfig, BudgetConfig, Config, DatasetConfig, PartitionScheme};
use fedsel_workbench::sweep::Sweep;

fn toml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            toml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "toml") {
            out.push(p);
        }
    }
}

/// Every shipped run config, and every cell of every shipped sweep, with its file.
fn shipped() -> Vec<(PathBuf, Config)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let mut files = Vec::new();
    toml_files(&root, &mut files);
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let table: toml::Table = std::fs::read_to_string(&f).unwrap().parse().unwrap();
        if table.contains_key("axes") {
            let s = Sweep::load(&f, &[]).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            for c in s.cells().unwrap() {
                out.push((f.clone(), c.config));
            }
        } else {
            let c = Config::load(Some(&f), &[]).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            out.push((f, c));
        }
    }
    out
}

/// N as the run will see it: a natural partition has one client per user of the data set.
fn clients(c: &Config) -> usize {
    match (&c.partition.scheme, &c.dataset) {
        (PartitionScheme::Natural, DatasetConfig::Synthetic { users, .. }) => *users,
        (PartitionScheme::Natural, DatasetConfig::Shakespeare { max_clients, .. }) => {
            assert!(
                *max_clients > 0,
                "{}: N is known only from the data",
                c.name
            );
            *max_clients
        }
        _ => c.partition.clients,
    }
}

#[test]
fn shipped_powd_runs_draw_more_candidates_than_they_keep() {
    let mut checked = 0;
    for (f, c) in shipped() {
        if !matches!(c.selection.strategy.as_str(), "powd" | "cpowd" | "rpowd") {
            continue;
        }
        let n = clients(&c);
        assert_eq!(c.budget, BudgetConfig::Constant, "{}", f.display());
        let m = c.selection.per_round(n);
        let p = &c.selection.powd;
        let d = p.candidates(m, n);
        let all = (p.d == 0 && p.d_per_m == 0) || d == n;
        assert!(
            all || d > m,
            "{} ({}): pow-d keeps all d = {d} candidates with m = {m}",
            f.display(),
            c.name
        );
        assert!(c.warnings(n).is_empty(), "{}: {:?}", c.name, c.warnings(n));
        checked += 1;
    }
    assert!(checked >= 20, "{checked} pow-d configs");
}

/// A trace path in a config file is taken from the file's directory, so every shipped trace
/// must be found from there, whatever the working directory.
#[test]
fn shipped_trace_files_exist() {
    let mut checked = 0;
    for (f, c) in shipped() {
        if let AvailabilityConfig::Trace(TraceConfig { trace }) = &c.availability {
            assert!(
                trace.is_file(),
                "{}: availability.trace {} is not a file",
                f.display(),
                trace.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 1, "{checked} trace configs");
}

#[test]
fn shipped_configs_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let mut files = Vec::new();
    toml_files(&root, &mut files);
    files.sort();
    assert!(files.len() >= 20, "{} config files", files.len());
    let (mut runs, mut cells) = (0, 0);
    for f in &files {
        let table: toml::Table = std::fs::read_to_string(f).unwrap().parse().unwrap();
        if table.contains_key("axes") {
            let s = Sweep::load(f, &[]).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            cells += s.cells().unwrap().len();
        } else {
            Config::load(Some(f), &[]).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            runs += 1;
        }
    }
    eprintln!(
        "{runs} run configs, {} sweeps with {cells} cells",
        files.len() - runs
    );
}

#[test]
fn fedcor_table1_cases_carry_their_own_m_and_target() {
    let root =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/fedcor/table1_fmnist.toml");
    let cells = Sweep::load(&root, &[]).unwrap().cells().unwrap();
    // Three partitions × four strategies × ten seeds (issue 22 item 9).
    assert_eq!(cells.len(), 120);
    assert!(cells.iter().any(|c| c.label == "2SPC-afl-s10"));
    let one = cells.iter().find(|c| c.label == "1SPC-uniform-s3").unwrap();
    assert_eq!(
        (
            one.config.selection.clients_per_round,
            one.config.targets.clone()
        ),
        (10, vec![0.62])
    );
    assert_eq!(one.config.seed, 3);
}

/// HiCS-FL Table 1 (FMNIST, CNN and CPU-sized) runs the paper's protocol in the paper's
/// regime (plain SGD, a fresh optimizer, 2 epochs, K = 5) beside the code's protocol in the
/// code's (momentum 0.9 kept between rounds, 1 epoch of FedProx μ = 0.5, K = 10) with a
/// Random of that regime; pow-d as the HiCS code ran it (d = 2K) beside the ideal d = N;
/// nothing is held out; the code's frozen updates follow the setting's α groups.
#[test]
fn hics_table1_runs_paper_positive_part_and_code_side_by_side() {
    use fedsel::config::{LocalWork, TrainConfig};
    use fedsel::select::hics::{HicsEstimator, HicsProtocol, HicsStatistic};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/hics");
    let paper_regime = |t: &TrainConfig| {
        (t.momentum, t.weight_decay, t.persistent_state, t.work, t.lr)
            == (0.0, 0.0, false, LocalWork::Epochs(2), 0.001)
    };
    let code_regime = |t: &TrainConfig| {
        (
            t.momentum,
            t.weight_decay,
            t.persistent_state,
            t.work,
            t.prox_mu,
        ) == (0.9, 5e-4, true, LocalWork::Epochs(1), 0.5)
    };
    for (file, model) in [
        ("table1_fmnist_cpu.toml", "mlp"),
        ("table1_fmnist.toml", "cnn_hics_code"),
    ] {
        let cells = Sweep::load(&root.join(file), &[]).unwrap().cells().unwrap();
        assert_eq!(cells.len(), 81, "{file}");
        assert!(
            cells
                .iter()
                .all(|c| c.config.partition.holdout_fraction == 0.0)
        );
        let cell = |label: &str| &cells.iter().find(|c| c.label == label).unwrap().config;
        for method in [
            "random",
            "powd",
            "powd-ideal",
            "cs",
            "divfl",
            "hics",
            "hics-positive",
        ] {
            let c = cell(&format!("setting2-{method}-s1"));
            assert!(paper_regime(&c.train), "{file} {method}");
            assert_eq!(c.selection.fraction, 0.1);
        }
        let paper = cell("setting2-hics-s1");
        assert_eq!(paper.selection.hics.protocol, HicsProtocol::Paper);
        assert_eq!(paper.selection.hics.statistic, HicsStatistic::Bias);
        assert_eq!(
            cell("setting2-hics-positive-s1").selection.hics.estimator,
            HicsEstimator::PositivePart
        );
        let powd = &cell("setting2-powd-s1").selection;
        assert_eq!(
            (powd.strategy.as_str(), powd.powd.candidates(5, 50)),
            ("powd", 10)
        );
        let ideal = &cell("setting2-powd-ideal-s1").selection;
        assert_eq!(
            (ideal.strategy.as_str(), ideal.powd.candidates(5, 50)),
            ("powd", 50)
        );
        let code = cell("setting2-hics-code-s1");
        let h = &code.selection.hics;
        assert_eq!(h.protocol, HicsProtocol::Code);
        assert_eq!(h.statistic, HicsStatistic::WeightRows);
        assert_eq!(
            (h.temperature, h.lambda, h.clusters, h.cs_switch),
            (0.001, 10.0, 5, 0.1)
        );
        assert!(h.several_alpha_groups);
        assert_eq!(code.selection.fraction, 0.2);
        assert!(code_regime(&code.train), "{file}");
        assert_eq!(code.model.kind, model);
        let random = cell("setting2-random-code-s1");
        assert_eq!(random.selection.strategy, "uniform");
        assert_eq!(
            (random.selection.fraction, &random.train, &random.model.kind),
            (0.2, &code.train, &code.model.kind)
        );
        assert!(
            !cell("setting3-hics-code-s1")
                .selection
                .hics
                .several_alpha_groups
        );
    }
}

/// F3AST Table 9 runs four arms: FedAvg, F3AST under `code` and `paper`, and FedAvg whose
/// server step is the `paper` arm's mean Σ_S weight (issue 22 item 6); only the control
/// changes the server lr.
#[test]
fn f3ast_table9_has_both_normalisations_and_the_step_size_control() {
    use fedsel::select::Protocol;
    let root =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/f3ast/table9_synthetic.toml");
    let cells = Sweep::load(&root, &[]).unwrap().cells().unwrap();
    assert_eq!(cells.len(), 3 * 4 * 10);
    let cell = |label: &str| &cells.iter().find(|c| c.label == label).unwrap().config;
    let (code, paper) = (cell("alpha0-f3ast-s1"), cell("alpha0-f3ast-paper-s1"));
    assert_eq!(code.selection.f3ast.protocol, Protocol::Code);
    assert_eq!(paper.selection.f3ast.protocol, Protocol::Paper);
    for label in [
        "alpha0.5-fedavg-s2",
        "alpha0-f3ast-s1",
        "alpha1-f3ast-paper-s3",
    ] {
        assert_eq!(cell(label).server.lr, 1.0, "{label}");
    }
    let control = cell("alpha1-fedavg-lr-s3");
    assert_eq!(
        control.selection.strategy,
        cell("alpha1-fedavg-s3").selection.strategy
    );
    assert!((control.server.lr - 2.583).abs() < 1e-12);
}

/// The CPU Shakespeare grid keeps the paper's regime (N = 715, β = 0.001, 500 rounds):
/// β·N ≈ 0.7 and β·T ≈ 0.5 (issue 22 item 7), with both F3AST normalisations.
#[test]
fn f3ast_shakespeare_cpu_grid_keeps_the_papers_beta_regime() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../configs/f3ast/tables23_shakespeare_cpu.toml");
    let cells = Sweep::load(&root, &[]).unwrap().cells().unwrap();
    assert_eq!(cells.len(), 3 * 3);
    for c in &cells {
        let DatasetConfig::Shakespeare { max_clients, .. } = c.config.dataset else {
            panic!("{}: not Shakespeare", c.label)
        };
        let beta = c.config.selection.f3ast.beta;
        let (bn, bt) = (beta * max_clients as f64, beta * c.config.rounds as f64);
        assert!(
            (0.6..=0.8).contains(&bn) && (0.4..=0.6).contains(&bt),
            "{}: β·N {bn}, β·T {bt}",
            c.label
        );
    }
    assert!(cells.iter().any(|c| c.label.contains("f3ast-paper")));
}

/// The per-setting HiCS-FL FMNIST configs: the paper's methods train in the paper's regime
/// (plain SGD, a fresh optimizer, 2 epochs of batch 64 at lr 0.001), the code's HiCS-FL
/// and its Random in the code's, pow-d draws d = 2K (d = N in `_powd_ideal`), and no
/// config holds examples out.
#[test]
fn hics_fmnist_configs_pin_their_protocols_regime() {
    use fedsel::config::LocalWork;
    use fedsel::select::hics::HicsProtocol;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/hics");
    for s in 1..=3 {
        let load =
            |m: &str| Config::load(Some(&root.join(format!("fmnist_s{s}_{m}.toml"))), &[]).unwrap();
        for m in [
            "random",
            "powd",
            "powd_ideal",
            "cs",
            "divfl",
            "hics",
            "hics_code",
            "random_code",
        ] {
            let c = load(m);
            let t = &c.train;
            assert_eq!(c.partition.holdout_fraction, 0.0, "s{s} {m}");
            assert_eq!((t.lr, t.batch_size), (0.001, 64), "s{s} {m}");
            let code = m.ends_with("code");
            assert_eq!(t.persistent_state, code, "s{s} {m}");
            assert_eq!(t.momentum, if code { 0.9 } else { 0.0 }, "s{s} {m}");
            assert_eq!(
                t.work,
                LocalWork::Epochs(if code { 1 } else { 2 }),
                "s{s} {m}"
            );
        }
        assert_eq!(load("hics").selection.hics.protocol, HicsProtocol::Paper);
        assert_eq!(
            load("hics_code").selection.hics.protocol,
            HicsProtocol::Code
        );
        assert_eq!(load("powd").selection.powd.candidates(5, 50), 10);
        assert_eq!(load("powd_ideal").selection.powd.candidates(5, 50), 50);
    }
}

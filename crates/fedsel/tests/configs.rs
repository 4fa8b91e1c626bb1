//! Every config shipped under `configs/` parses and validates: run configs as configs,
//! sweep files (those with `[axes]`) with every cell resolved.

use std::path::{Path, PathBuf};

use fedsel::config::Config;
use fedsel::sweep::Sweep;

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
            let s = Sweep::load(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
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
    let cells = Sweep::load(&root).unwrap().cells().unwrap();
    assert_eq!(cells.len(), 60);
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

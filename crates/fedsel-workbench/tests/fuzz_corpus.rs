//! Replays the stored fuzz corpora on stable, without fuzzing: every input under
//! `fuzz/corpus/<target>/` goes through the same entry point the fuzz target calls
//! (`fedsel::fuzzing`, or `fedsel_workbench::fuzzing` for sweeps), which must answer Ok
//! or a typed error, never panic. Inputs that
//! once crashed a parser stay in the corpora, so this is also their regression test.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use fedsel::fuzzing::Target;

/// Every fuzz target, with the crate whose `fuzzing` module holds its entry point.
fn targets() -> impl Iterator<Item = (&'static str, &'static str, Target)> {
    let core = fedsel::fuzzing::TARGETS
        .iter()
        .map(|&(n, e)| ("fedsel", n, e));
    let workbench = fedsel_workbench::fuzzing::TARGETS
        .iter()
        .map(|&(n, e)| ("fedsel_workbench", n, e));
    core.chain(workbench)
}

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join("corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_stored_input_is_accepted_or_refused_without_panicking() {
    for (_, target, entry) in targets() {
        let files = inputs(target);
        assert!(!files.is_empty(), "{target}: the corpus is empty");
        let mut accepted = 0;
        for file in &files {
            let bytes = std::fs::read(file).unwrap();
            match catch_unwind(AssertUnwindSafe(|| entry(&bytes))) {
                Ok(Ok(())) => accepted += 1,
                Ok(Err(_)) => {}
                Err(_) => panic!("{target}: {} panicked", file.display()),
            }
        }
        // The seeds are valid files, so the success path is replayed too.
        assert!(accepted > 0, "{target}: no input of the corpus parses");
    }
}

/// The fuzz targets are nightly-only and never built here, so this is what keeps them
/// and the two crates' `fuzzing::TARGETS` the same set, each a call of its entry point.
#[test]
fn every_fuzz_target_calls_its_shared_entry_point() {
    let mut declared: Vec<String> = std::fs::read_dir(fuzz_dir().join("fuzz_targets"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let source = std::fs::read_to_string(&p).unwrap();
            let owner = targets().find(|t| t.1 == name).map_or("fedsel", |t| t.0);
            let call = format!("{owner}::fuzzing::{name}(data)");
            assert!(
                source.contains(&call),
                "{}: does not call {call}",
                p.display()
            );
            name
        })
        .collect();
    declared.sort();
    let mut shared: Vec<&str> = targets().map(|t| t.1).collect();
    shared.sort();
    assert_eq!(declared, shared);
}

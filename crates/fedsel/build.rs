//! Records the git commit the library is built from, and whether the sources that build the
//! binary differed from it, so that every run's `summary.json` names the code that made it
//! (`fedsel::BUILD`) and `fedsel results collect` reads the commit from the runs instead of
//! a hand-typed flag.

use std::path::Path;
use std::process::Command;

fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest)
        .ancestors()
        .nth(2)
        .expect("the crate lies two levels under the workspace root");
    let commit = git(root, &["rev-parse", "HEAD"]);
    // Tracked or new files under the workspace's sources and manifests: what builds the
    // binary. Changes elsewhere (docs, results, configs) leave the build clean.
    let dirty = commit.is_some()
        && git(
            root,
            &[
                "status",
                "--porcelain",
                "--",
                "crates",
                "examples",
                "Cargo.toml",
                "Cargo.lock",
            ],
        )
        .is_some_and(|s| !s.is_empty());
    println!(
        "cargo:rustc-env=FEDSEL_GIT_COMMIT={}",
        commit.as_deref().unwrap_or("")
    );
    println!("cargo:rustc-env=FEDSEL_GIT_DIRTY={dirty}");
    // Run again when a commit is made or checked out, and when a source changes (a
    // directory is scanned whole).
    if let Some(dir) = git(root, &["rev-parse", "--absolute-git-dir"]) {
        for f in ["HEAD", "index", "refs", "packed-refs"] {
            println!("cargo:rerun-if-changed={dir}/{f}");
        }
    }
    for p in ["crates", "examples", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
}

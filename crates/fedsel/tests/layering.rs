//! The core crate's top-level modules form layers: no module reaches, through the
//! `crate::` paths of its non-test code, a module that reaches it back (issue 24: `config`
//! and the selectors once used each other). A circle makes each side impossible to read,
//! test or move without the other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules its non-test code names through `crate::`.
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&src).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let module = first.trim_end_matches(".rs").to_string();
            if module == "lib" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // A module's tests in their own file (`dir/tests.rs`) are test code whole, as
            // long as the module's file (`dir/mod.rs`, or `dir.rs` beside the directory)
            // declares them under `#[cfg(test)]`.
            if path.file_name().is_some_and(|n| n == "tests.rs") {
                let inside = path.with_file_name("mod.rs");
                let module_file = if inside.exists() {
                    inside
                } else {
                    dir.with_extension("rs")
                };
                let parent = std::fs::read_to_string(&module_file).unwrap();
                assert!(
                    parent.contains("#[cfg(test)]\nmod tests;"),
                    "{} is compiled outside tests",
                    path.display()
                );
                continue;
            }
            let code = text.split("#[cfg(test)]").next().unwrap();
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (i, _) in line.match_indices("crate::") {
                    let name: String = line[i + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != module {
                        out.entry(module.clone()).or_default().insert(name);
                    }
                }
            }
        }
    }
    out
}

#[test]
fn no_top_level_module_reaches_itself() {
    let edges = edges();
    assert!(edges.contains_key("config") && edges.contains_key("engine"));
    for start in edges.keys() {
        // Depth-first from `start`, recording the path that leads back to it.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((m, path)) = stack.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                assert!(
                    next != start,
                    "import circle: {} -> {next}",
                    path.join(" -> ")
                );
                if seen.insert(next.clone()) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
}

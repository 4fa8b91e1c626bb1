//! `fedsel results check`: whether the page still is what render makes of the rows, and
//! whether a section's code changed after its rows without a note that vouches for them.
//! It reads; it writes nothing.

use super::*;

/// What [`check`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checked {
    /// Every problem that should stop CI, each a sentence naming the section.
    pub problems: Vec<String>,
    /// What a reader should know and CI need not stop for: each post-hoc claim, and why the
    /// claims block could not be checked when the history cannot date the claims.
    pub notes: Vec<String>,
}

/// `fedsel results check`: no problem when the page `doc` matches what [`render`] makes of
/// `dir`, every section with rows has a block and names its code paths in `sections.toml`,
/// and no code path changed after a row's commit without notes that account for it
/// ([`SectionInfo::notes_through`]; notes without it leave their section unchecked, and a
/// note says so). Code-path changes and the
/// claims' provenance are asked of git in the repository that holds `dir`; the notes name
/// each post-hoc claim ([`registration::post_hoc_notes`]). Without a history that can date the
/// claims the claims block is not compared, and a note says why (never a problem: a shallow
/// clone cannot tell).
pub fn check(dir: &Path, doc: &Path) -> Result<Checked> {
    let data = load(dir)?;
    let history = Git::open(dir);
    let mut notes = Vec::new();
    match &history {
        Ok(h) => {
            let prov = registration::provenance(&data.claims, &data.rows, h);
            notes.extend(registration::post_hoc_notes(&data.claims, &prov));
        }
        Err(why) if !data.claims.is_empty() => notes.push(format!(
            "the claims block was not checked: their provenance needs the repository's history ({why})"
        )),
        Err(_) => {}
    }
    let rendered = render(
        &data,
        history
            .as_ref()
            .ok()
            .map(|g| g as &dyn registration::History),
    )?;
    let text = std::fs::read_to_string(doc).map_err(io(doc))?;
    let found = blocks(&text, doc)?;
    let mut problems = Vec::new();
    let unchecked_claims = history.is_err() && !data.claims.is_empty();
    for (name, range) in &found {
        match rendered.get(name) {
            None if unchecked_claims && name == claims::BLOCK => {}
            None => problems.push(format!(
                "{}: block `{name}` names a section with no rows or paper values in {}",
                doc.display(),
                dir.display()
            )),
            Some(body) if body != &text[range.clone()] => problems.push(format!(
                "{}: block `{name}` no longer matches its CSVs; run `fedsel results render`",
                doc.display()
            )),
            Some(_) => {}
        }
    }
    for name in rendered.keys().filter(|n| !found.contains_key(*n)) {
        problems.push(format!(
            "{}: section `{name}` has no block; run `fedsel results render`",
            doc.display()
        ));
    }
    let mut commits: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in &data.rows {
        commits.entry(&r.section).or_default().insert(&r.commit);
    }
    let mut top: Option<PathBuf> = None;
    for (section, commits) in commits {
        let Some(info) = data.sections.get(section) else {
            problems.push(format!(
                "{}: section `{section}` names no code paths (give it `paths`)",
                dir.join(SECTIONS_FILE).display()
            ));
            continue;
        };
        let noted = info.notes.as_deref().is_some_and(|n| !n.trim().is_empty());
        let through = info.notes_through.as_deref();
        match (noted, through) {
            (false, Some(t)) => {
                problems.push(format!(
                    "section `{section}`: `notes_through = \"{t}\"` in {SECTIONS_FILE} without `notes` to vouch"
                ));
                continue;
            }
            (true, None) => {
                notes.push(format!(
                    "section `{section}`: its `notes` name no `notes_through` commit, so changes to its code paths are not checked"
                ));
                continue;
            }
            _ => {}
        }
        if info.paths.is_empty() {
            continue;
        }
        let root = match &top {
            Some(t) => t.clone(),
            None => {
                let t = git(dir, &["rev-parse", "--show-toplevel"])?;
                let t = PathBuf::from(t.trim());
                top = Some(t.clone());
                t
            }
        };
        if let Some(t) = through
            && let Err(e) = git(
                &root,
                &[
                    "rev-parse",
                    "--verify",
                    "--quiet",
                    &format!("{t}^{{commit}}"),
                ],
            )
        {
            problems.push(format!(
                "section `{section}`: `notes_through = \"{t}\"` in {SECTIONS_FILE} is no commit of this history: {e}"
            ));
            continue;
        }
        for commit in commits {
            // The changes after the rows' commit that the notes do not cover.
            let mut args = vec!["log".to_string(), "--format=%h".into(), "HEAD".into()];
            args.push(format!("^{commit}"));
            args.extend(through.map(|t| format!("^{t}")));
            args.push("--".into());
            args.extend(info.paths.iter().cloned());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match git(&root, &args) {
                Ok(out) if out.trim().is_empty() => {}
                Ok(out) => {
                    let changed = out.split_whitespace().collect::<Vec<_>>().join(", ");
                    problems.push(match through {
                        None => format!(
                            "section `{section}`: its code paths changed after commit {commit} (in {changed}) and `notes` in {SECTIONS_FILE} does not say why the results stand"
                        ),
                        Some(t) => format!(
                            "section `{section}`: its code paths changed after commit {commit} and after {t}, the last its `notes` account for (in {changed}): say in `notes` why the results stand, then move `notes_through`"
                        ),
                    });
                }
                Err(e) => problems.push(format!("section `{section}`: commit {commit}: {e}")),
            }
        }
    }
    Ok(Checked { problems, notes })
}

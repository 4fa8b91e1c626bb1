//! When each claim was registered, against when and how its rows ran: the label
//! "pre-registered" is earned from the repository's history, never typed.
//!
//! A claim is registered at the first commit from which its **test** has stood unchanged:
//! the keys that decide what is compared and what counts ([`SIGNED`]: the section, metric,
//! settings, arms, effect, direction, stated size and variant). A claim whose arms, size or
//! variant changed after its first rows is therefore registered after them and turns post hoc
//! by itself. A row counts toward a pre-registered verdict only if it ran at a descendant of
//! that commit **with the arms' configs as registered**: no commit between the registration
//! and the row's own changed a config file its command names, or a `base` file those name
//! (read at the row's commit). The config files are the record of the arms: a hash typed
//! into a claims file would be only as good as the hand that typed it, while the history of
//! the files the command read cannot be rewritten without rewriting every later commit.
//! This room reads the history and the rows; it renders nothing and judges no claim.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use fedsel::error::ConfigError;

use super::Row;
use super::claims::{ClaimSpec, Paired, Test};

/// The keys of a `[[claim]]` table that make its test; a change to any of them after the
/// claim's rows makes the claim post hoc. The wording (`quote`, `place`, `claimed`) and the
/// `confirmatory_section` a post-hoc claim later names are not among them.
pub const SIGNED: [&str; 10] = [
    "section",
    "metric",
    "settings",
    "a",
    "b",
    "effect",
    "direction",
    "size",
    "variant",
    "not_testable",
];

/// What [`provenance`] asks of the repository's history; errors are git's words.
pub trait History {
    /// The oldest commit whose change to the claims folder adds `needle`; `None` when no
    /// commit does (not committed yet).
    fn first_adding(&self, needle: &str) -> std::result::Result<Option<String>, String>;
    /// Whether `ancestor` is `commit` or one of its ancestors.
    fn is_ancestor(&self, ancestor: &str, commit: &str) -> std::result::Result<bool, String>;
    /// Every committed version of the claims file `file`, oldest first: the commit and the
    /// text it left (`None` where it removed the file).
    fn versions(&self, file: &Path) -> std::result::Result<Vec<(String, Option<String>)>, String>;
    /// The text of `path` (inside the checkout) at `commit`; `None` where it had none.
    fn file_at(&self, commit: &str, path: &str) -> Option<String>;
    /// For every config hash the results folder's rows have held, the oldest commit that
    /// added a row with it: when a run's outcome was first on record.
    fn first_recorded(&self) -> std::result::Result<BTreeMap<String, String>, String>;
    /// Which of `paths` a commit after `since`, up to `commit`, changed.
    fn changed(
        &self,
        since: &str,
        commit: &str,
        paths: &[String],
    ) -> std::result::Result<Vec<String>, String>;
}

/// A [`History`] that asks its inner one each question once: the claims of a file share its
/// versions, and claims on one section share their run commits, base files and ranges.
struct Remembered<'h> {
    inner: &'h dyn History,
    versions: RefCell<BTreeMap<PathBuf, Answer<Versions>>>,
    ancestors: RefCell<BTreeMap<(String, String), Answer<bool>>>,
    files: RefCell<BTreeMap<(String, String), Option<String>>>,
    changed: RefCell<BTreeMap<Range, Answer<Vec<String>>>>,
}

/// A file's committed versions: (commit, its text there).
type Versions = Vec<(String, Option<String>)>;

/// (since, commit, paths): one question of [`History::changed`].
type Range = (String, String, Vec<String>);

type Answer<T> = std::result::Result<T, String>;

impl<'h> Remembered<'h> {
    fn new(inner: &'h dyn History) -> Self {
        Remembered {
            inner,
            versions: RefCell::default(),
            ancestors: RefCell::default(),
            files: RefCell::default(),
            changed: RefCell::default(),
        }
    }
}

/// The answer `map` holds for `key`, asked of `ask` the first time.
fn remember<K: Ord, V: Clone>(map: &RefCell<BTreeMap<K, V>>, key: K, ask: impl FnOnce() -> V) -> V {
    if let Some(v) = map.borrow().get(&key) {
        return v.clone();
    }
    let v = ask();
    map.borrow_mut().insert(key, v.clone());
    v
}

impl History for Remembered<'_> {
    fn first_adding(&self, needle: &str) -> Answer<Option<String>> {
        self.inner.first_adding(needle)
    }

    fn is_ancestor(&self, ancestor: &str, commit: &str) -> Answer<bool> {
        remember(&self.ancestors, (ancestor.into(), commit.into()), || {
            self.inner.is_ancestor(ancestor, commit)
        })
    }

    fn versions(&self, file: &Path) -> Answer<Versions> {
        remember(&self.versions, file.to_path_buf(), || {
            self.inner.versions(file)
        })
    }

    fn file_at(&self, commit: &str, path: &str) -> Option<String> {
        remember(&self.files, (commit.into(), path.into()), || {
            self.inner.file_at(commit, path)
        })
    }

    fn first_recorded(&self) -> Answer<BTreeMap<String, String>> {
        self.inner.first_recorded()
    }

    fn changed(&self, since: &str, commit: &str, paths: &[String]) -> Answer<Vec<String>> {
        remember(
            &self.changed,
            (since.into(), commit.into(), paths.to_vec()),
            || self.inner.changed(since, commit, paths),
        )
    }
}

/// When a claim (or its confirmatory set) was registered, beside when its rows ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    /// The commit from which its test has stood unchanged (for a confirmatory set, the
    /// later of that and the commit that first names its section).
    pub commit: String,
    /// Each commit its rows ran at, with whether `commit` is that commit or an ancestor.
    pub runs: BTreeMap<String, bool>,
    /// For each run commit after the registration, the config files its arms read that
    /// changed in between.
    pub changed: BTreeMap<String, Vec<String>>,
    /// For each run commit after the registration, the earlier commits where rows of the
    /// same configs (the same config hash: the same experiment, seed included) were already
    /// on record before the registration: a rerun of a run already seen.
    pub seen: BTreeMap<String, BTreeSet<String>>,
}

impl Registration {
    /// Some of its rows ran before it, or with configs other than those registered: the
    /// claim was written, or its arms set, with (some of) its results at hand.
    pub fn post_hoc(&self) -> bool {
        self.runs.values().any(|&after| !after) || !self.changed.is_empty() || !self.seen.is_empty()
    }
}

/// A registration, or why the history cannot give it.
#[derive(Debug, Clone, PartialEq)]
pub enum Provenance {
    /// From the history.
    Known(Registration),
    /// Not committed yet, changed since its last commit, or a commit the history lacks.
    Unknown(String),
}

/// A claim's provenance and its confirmatory set's.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimProvenance {
    /// The claim's, over the rows of its section.
    pub claim: Provenance,
    /// The confirmatory set's, over the rows of its section, when the claim names one with
    /// rows.
    pub confirmatory: Option<Provenance>,
}

pub(super) fn short(commit: &str) -> &str {
    commit.get(..7).unwrap_or(commit)
}

/// A number as one kind, so that `size = [2, 3]` and `[2.0, 3.0]` sign alike.
fn canonical(v: &toml::Value) -> String {
    match v {
        toml::Value::Integer(i) => format!("{:?}", *i as f64),
        toml::Value::Float(f) => format!("{f:?}"),
        toml::Value::Array(xs) => format!(
            "[{}]",
            xs.iter().map(canonical).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

/// The [`SIGNED`] keys of claim `id` in a claims file's text, as one comparable string;
/// `None` when the text does not parse or holds no such claim.
fn signature(text: &str, id: &str) -> Option<String> {
    let table: toml::Table = toml::from_str(text).ok()?;
    let claim = table
        .get("claim")?
        .as_array()?
        .iter()
        .filter_map(toml::Value::as_table)
        .find(|c| c.get("id").and_then(toml::Value::as_str) == Some(id))?;
    // A key left at its default signs as the default written out.
    let default = |k: &str| match k {
        "variant" => Some(toml::Value::String("authors".into())),
        "settings" => Some(toml::Value::Array(Vec::new())),
        _ => None,
    };
    Some(
        SIGNED
            .iter()
            .map(|k| {
                let v = claim.get(*k).cloned().or_else(|| default(k));
                format!("{k}={}", v.as_ref().map_or("-".into(), canonical))
            })
            .collect::<Vec<_>>()
            .join("; "),
    )
}

/// The commit from which claim `spec`'s test has stood unchanged in its file: the oldest
/// version of the last unbroken run of versions whose [`signature`] is the file's on disk.
fn registered_at(spec: &ClaimSpec, history: &dyn History) -> Provenance {
    let now = std::fs::read_to_string(&spec.file)
        .ok()
        .and_then(|t| signature(&t, &spec.id));
    let Some(now) = now else {
        return Provenance::Unknown(format!("{} cannot be read", spec.file.display()));
    };
    let versions = match history.versions(&spec.file) {
        Ok(v) => v,
        Err(e) => return Provenance::Unknown(e),
    };
    let mut since = None;
    for (commit, text) in versions.iter().rev() {
        if text
            .as_deref()
            .and_then(|t| signature(t, &spec.id))
            .as_ref()
            != Some(&now)
        {
            break;
        }
        since = Some(commit);
    }
    match (since, versions.last()) {
        (Some(c), _) => Provenance::Known(Registration {
            commit: c.clone(),
            runs: BTreeMap::new(),
            changed: BTreeMap::new(),
            seen: BTreeMap::new(),
        }),
        (None, None) => Provenance::Unknown(format!("\"{}\" is not committed yet", spec.id)),
        (None, Some(_)) => Provenance::Unknown(format!(
            "the test of \"{}\" changed since its last commit",
            spec.id
        )),
    }
}

/// The rows a claim's test reads in `section`, as commit → command → config hashes: only
/// planned rows, since unplanned ones enter no test and so say nothing of when the claim was
/// written against its runs.
type Runs<'a> = BTreeMap<&'a str, BTreeMap<&'a str, BTreeSet<&'a str>>>;

fn runs_of<'a>(p: &Paired, section: &str, rows: &'a [Row]) -> Runs<'a> {
    let mut out: Runs = BTreeMap::new();
    for r in rows.iter().filter(|r| {
        r.planned
            && r.section == section
            && r.metric == p.metric
            && (r.method == p.a || r.method == p.b)
            && (p.settings.is_empty() || p.settings.contains(&r.setting))
    }) {
        out.entry(r.commit.as_str())
            .or_default()
            .entry(r.command.as_str())
            .or_default()
            .insert(r.config_hash.as_str());
    }
    out
}

/// `commit`'s registration over `runs`: which ran after it, which read configs other than
/// those registered ([`unregistered_configs`]), and which repeat runs whose rows were on
/// record before it (`recorded`: [`History::first_recorded`]).
fn register(
    commit: String,
    runs: &Runs,
    recorded: &BTreeMap<String, String>,
    history: &dyn History,
) -> Provenance {
    let mut after = BTreeMap::new();
    let mut changed = BTreeMap::new();
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (run, commands) in runs {
        let is_after = match history.is_ancestor(&commit, run) {
            Ok(a) => a,
            Err(e) => return Provenance::Unknown(format!("run commit {}: {e}", short(run))),
        };
        after.insert((*run).to_string(), is_after);
        if !is_after {
            continue;
        }
        let mut files = BTreeSet::new();
        for (command, hashes) in commands {
            match unregistered_configs(&commit, run, command, hashes, history) {
                Ok(f) => files.extend(f),
                Err(e) => return Provenance::Unknown(format!("run commit {}: {e}", short(run))),
            }
            for first in hashes.iter().filter_map(|h| recorded.get(*h)) {
                let earlier = match history.is_ancestor(&commit, first) {
                    Ok(a) => !a,
                    Err(e) => return Provenance::Unknown(format!("commit {}: {e}", short(first))),
                };
                if earlier {
                    seen.entry((*run).to_string())
                        .or_default()
                        .insert(first.clone());
                }
            }
        }
        if !files.is_empty() {
            changed.insert((*run).to_string(), files.into_iter().collect());
        }
    }
    Provenance::Known(Registration {
        commit,
        runs: after,
        changed,
        seen,
    })
}

/// The config files that make the rows of `command` at `run` unregistered at `registered`:
/// none when no file the command read (those it names and their `base` files, as `run` had
/// them) changed in between; none either when they changed but every row's config hash is
/// still one the sweep gave at `registered` (a change to another arm of the grid); else the
/// files that changed.
fn unregistered_configs(
    registered: &str,
    run: &str,
    command: &str,
    hashes: &BTreeSet<&str>,
    history: &dyn History,
) -> std::result::Result<Vec<String>, String> {
    let named = command_configs(command);
    let mut files = named.clone();
    let mut i = 0;
    while i < files.len() {
        let base = history
            .file_at(run, &files[i])
            .and_then(|t| toml::from_str::<toml::Table>(&t).ok())
            .and_then(|t| t.get("base").and_then(|b| b.as_str()).map(str::to_string));
        if let Some(b) = base {
            let b = beside(&files[i], &b);
            if !files.contains(&b) {
                files.push(b);
            }
        }
        i += 1;
    }
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let changed = history.changed(registered, run, &files)?;
    if changed.is_empty() {
        return Ok(changed);
    }
    let registered_hashes = match named.as_slice() {
        [sweep] if is_sweep(command) => sweep_hashes(registered, sweep, command, history),
        _ => BTreeSet::new(),
    };
    if hashes.iter().all(|h| registered_hashes.contains(*h)) {
        Ok(Vec::new())
    } else {
        Ok(changed)
    }
}

fn is_sweep(command: &str) -> bool {
    let words: Vec<&str> = command.split_whitespace().collect();
    words
        .windows(2)
        .any(|w| w[0] == "fedsel" && w[1] == "sweep")
}

/// The config hashes of every cell of the sweep file `sweep` as `commit` had it (its base
/// too), with the command's `--set` overrides: the arms as registered. Empty where that
/// version cannot be read as a sweep.
fn sweep_hashes(
    commit: &str,
    sweep: &str,
    command: &str,
    history: &dyn History,
) -> BTreeSet<String> {
    let Some(text) = history.file_at(commit, sweep) else {
        return BTreeSet::new();
    };
    let here = Path::new(sweep).parent().unwrap_or(Path::new(""));
    let overrides = set_overrides(command);
    let read = |p: &Path| {
        let inside = normalize(&p.to_string_lossy());
        history
            .file_at(commit, &inside)
            .ok_or_else(|| ConfigError::Parse {
                source_name: inside.clone(),
                message: format!("not in commit {}", short(commit)),
            })
    };
    match crate::sweep::Sweep::from_toml_str(&text, sweep, here, &overrides, read)
        .and_then(|s| s.cells())
    {
        Ok(cells) => cells.into_iter().map(|c| c.hash).collect(),
        Err(_) => BTreeSet::new(),
    }
}

/// The `--set KEY=VALUE` overrides of a command, as `fedsel sweep` took them.
fn set_overrides(command: &str) -> Vec<String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "--set")
        .map(|w| w[1].trim_matches('\'').to_string())
        .collect()
}

/// Each paired claim's provenance from `history` ([`registered_at`] against its rows'
/// commits and configs), and likewise its confirmatory set's, registered where the claims
/// first name its section (or later, where the claim's test changed after that).
pub fn provenance(
    claims: &[ClaimSpec],
    rows: &[Row],
    history: &dyn History,
) -> BTreeMap<String, ClaimProvenance> {
    let remembered = Remembered::new(history);
    let history: &dyn History = &remembered;
    let mut out = BTreeMap::new();
    let recorded = match history.first_recorded() {
        Ok(r) => r,
        Err(e) => {
            for spec in claims.iter().filter(|c| matches!(c.test, Test::Paired(_))) {
                out.insert(
                    spec.id.clone(),
                    ClaimProvenance {
                        claim: Provenance::Unknown(e.clone()),
                        confirmatory: None,
                    },
                );
            }
            return out;
        }
    };
    for spec in claims {
        let Test::Paired(p) = &spec.test else {
            continue;
        };
        let at = registered_at(spec, history);
        let claim = match &at {
            Provenance::Known(r) => register(
                r.commit.clone(),
                &runs_of(p, &p.section, rows),
                &recorded,
                history,
            ),
            Provenance::Unknown(why) => Provenance::Unknown(why.clone()),
        };
        let confirmatory = p.confirmatory_section.as_ref().and_then(|c| {
            let runs = runs_of(p, c, rows);
            (!runs.is_empty())
                .then(|| confirmatory_at(c, &at, history))
                .map(|first| match first {
                    Ok(commit) => register(commit, &runs, &recorded, history),
                    Err(why) => Provenance::Unknown(why),
                })
        });
        out.insert(
            spec.id.clone(),
            ClaimProvenance {
                claim,
                confirmatory,
            },
        );
    }
    out
}

/// Where a confirmatory set is registered: the first commit naming `section` in the claims,
/// or the claim's own registration where that came later (the set then tests the claim as
/// it stands).
fn confirmatory_at(
    section: &str,
    claim: &Provenance,
    history: &dyn History,
) -> std::result::Result<String, String> {
    let Provenance::Known(r) = claim else {
        return Err("the claim's own registration is unknown".into());
    };
    let named = history
        .first_adding(&format!("\"{section}\""))?
        .ok_or_else(|| format!("\"{section}\" is not committed yet"))?;
    Ok(if history.is_ancestor(&r.commit, &named)? {
        named
    } else {
        r.commit.clone()
    })
}

/// A provenance as the page writes it.
pub(super) fn provenance_text(p: &Provenance) -> String {
    match p {
        Provenance::Unknown(why) => format!("unknown: {why}"),
        Provenance::Known(r) => {
            let list = |after: bool| {
                r.runs
                    .iter()
                    .filter(|(_, a)| **a == after)
                    .map(|(c, _)| format!("`{}`", short(c)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let before: Vec<_> = r.runs.iter().filter(|(_, a)| !**a).collect();
            if r.runs.is_empty() {
                format!("registered at `{}`, not run yet", short(&r.commit))
            } else if !before.is_empty() {
                let after = list(true);
                format!(
                    "post hoc: registered at `{}`, after its runs at {}{}",
                    short(&r.commit),
                    list(false),
                    if after.is_empty() {
                        String::new()
                    } else {
                        format!(" (and before those at {after})")
                    }
                )
            } else if !r.seen.is_empty() {
                let earlier: BTreeSet<&str> = r.seen.values().flatten().map(|c| short(c)).collect();
                format!(
                    "post hoc: registered at `{}`; the runs at {} repeat runs on record before it (at {})",
                    short(&r.commit),
                    r.seen
                        .keys()
                        .map(|c| format!("`{}`", short(c)))
                        .collect::<Vec<_>>()
                        .join(", "),
                    earlier
                        .into_iter()
                        .map(|c| format!("`{c}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else if !r.changed.is_empty() {
                let changed: BTreeSet<&str> =
                    r.changed.values().flatten().map(String::as_str).collect();
                format!(
                    "post hoc: registered at `{}`; its arms' configs changed before the runs at {} ({})",
                    short(&r.commit),
                    r.changed
                        .keys()
                        .map(|c| format!("`{}`", short(c)))
                        .collect::<Vec<_>>()
                        .join(", "),
                    changed.into_iter().collect::<Vec<_>>().join(", ")
                )
            } else {
                format!(
                    "pre-registered: registered at `{}`, run at {} with its configs as registered",
                    short(&r.commit),
                    list(true)
                )
            }
        }
    }
}

/// One line per post-hoc claim: what `fedsel results check` reports of the history.
pub fn post_hoc_notes(
    claims: &[ClaimSpec],
    prov: &BTreeMap<String, ClaimProvenance>,
) -> Vec<String> {
    claims
        .iter()
        .filter_map(|spec| {
            let cp = prov.get(&spec.id)?;
            let Provenance::Known(r) = &cp.claim else {
                return Some(format!(
                    "claim `{}`: {}",
                    spec.id,
                    provenance_text(&cp.claim)
                ));
            };
            r.post_hoc().then(|| {
                format!(
                    "claim `{}`: {}; {}",
                    spec.id,
                    provenance_text(&cp.claim),
                    cp.confirmatory.as_ref().map_or(
                        "no confirmatory runs".to_string(),
                        |c| format!("confirmatory set {}", provenance_text(c))
                    )
                )
            })
        })
        .collect()
}

/// The config files a command names: its words ending in `.toml`, relative to the root of
/// the checkout it ran in; a bare file name after a path takes that path's folder ("sweep
/// configs/a/x.toml and y.toml").
pub fn command_configs(command: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut folder: Option<String> = None;
    for word in command.split_whitespace() {
        let word = word.rsplit('=').next().unwrap_or(word);
        let word = word.trim_matches(|c: char| "\"'(),;:".contains(c));
        if !word.ends_with(".toml") {
            continue;
        }
        let path = match (word.rsplit_once('/'), &folder) {
            (Some((dir, _)), _) => {
                folder = Some(dir.to_string());
                word.to_string()
            }
            (None, Some(dir)) => format!("{dir}/{word}"),
            (None, None) => word.to_string(),
        };
        if !out.contains(&path) {
            out.push(path);
        }
    }
    out
}

/// `path` with `.` and `..` resolved lexically, as a path inside the checkout.
pub fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "." | "" => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

/// The file a config at `path` names as its `base` (relative to the config's folder).
pub fn beside(path: &str, base: &str) -> String {
    match path.rsplit_once('/') {
        Some((dir, _)) => normalize(&format!("{dir}/{base}")),
        None => normalize(base),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commands_config_files_are_its_toml_words() {
        assert_eq!(
            command_configs(
                "FEDSEL_DATA=../shared/data nice fedsel sweep configs/system/tta_all.toml --out runs/x --jobs 1 and tta_all_45.toml (their cells"
            ),
            [
                "configs/system/tta_all.toml",
                "configs/system/tta_all_45.toml"
            ]
        );
        assert_eq!(
            command_configs("fedsel run --config=\"configs/a.toml\" --set rounds=2"),
            ["configs/a.toml"]
        );
        assert!(command_configs("fedsel run --set rounds=2").is_empty());
    }

    #[test]
    fn bases_resolve_beside_their_config() {
        assert_eq!(
            beside("configs/hics/claims.toml", "../fedcor/base.toml"),
            "configs/fedcor/base.toml"
        );
        assert_eq!(beside("mine/s.toml", "./b.toml"), "mine/b.toml");
        assert_eq!(
            normalize("configs/hics/../fedcor/./x.toml"),
            "configs/fedcor/x.toml"
        );
    }

    #[test]
    fn the_signature_is_the_test_not_its_wording() {
        let v1 = "[[claim]]\nid = \"x\"\nquote = \"q\"\na = \"f\"\nb = \"g\"\nsize = [2, 3]\n";
        let reworded = v1.replace("quote = \"q\"", "quote = \"another\"");
        let floats = v1.replace("[2, 3]", "[2.0, 3.0]");
        let resized = v1.replace("[2, 3]", "[2.5, 3]");
        let defaults = v1.replace("size", "variant = \"authors\"\nsettings = []\nsize");
        let s = signature(v1, "x").unwrap();
        assert_eq!(signature(&reworded, "x").unwrap(), s);
        assert_eq!(signature(&floats, "x").unwrap(), s);
        assert_ne!(signature(&resized, "x").unwrap(), s);
        assert_eq!(signature(&defaults, "x").unwrap(), s);
        assert_eq!(signature(v1, "y"), None);
        assert_eq!(signature("not toml [", "x"), None);
    }
}
